"""How a traced ``jaxmg.potrs`` call walks through jaxmg's modules.

Records, with ``sys.setprofile``, every Python ``call`` event whose code lies in the installed
packages ``jaxmg``, ``jaxmg_layout`` and ``jaxmg_cuda`` (their directories are taken from each
module's ``__file__`` at run time; this script itself is not counted) while
``jax.jit(jaxmg.potrs).lower(A, b)`` runs once, cold (nothing warmed up beyond the imports), on
a Hermitian positive definite float64 ``A`` (N x N, sharded ``P("x", None)`` over simulated CPU
devices) and a replicated ``b`` of shape [N]. Calls that JAX's tracing makes back into jaxmg
(custom_jvp rules and the like) count too; so does each resumption of a generator.

Printed: the number of calls; the number of distinct modules (``frame.f_globals["__name__"]``);
the number of returns; and the module path. The path is the sequence of the calls' modules
with consecutive repeats collapsed (``a a b b a`` -> ``a b a``). A return is a step of the
path into a module that already appeared earlier in it (``a b a c b`` has 2: the second ``a``
and the second ``b``). No module names are assumed, so any module layout works.

    python benchmarks/call_trace.py                      # N=64 on 4 simulated CPU devices
    python benchmarks/call_trace.py --n 256 --devices 8 --json
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import sys

PACKAGES = ("jaxmg", "jaxmg_layout", "jaxmg_cuda")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=64, help="matrix size N (default 64)")
    p.add_argument("--devices", type=int, default=4, help="simulated CPU devices (default 4)")
    p.add_argument("--json", action="store_true", help="print one JSON line instead")
    p.add_argument(
        "--functions", action="store_true", help="also print each step's functions, one a line"
    )
    return p.parse_args(argv)


def package_dirs() -> tuple[str, ...]:
    """The directories of jaxmg's packages, each ending in a separator."""
    dirs = []
    for name in PACKAGES:
        module = importlib.import_module(name)
        dirs.append(os.path.join(os.path.dirname(os.path.realpath(module.__file__)), ""))
    return tuple(dirs)


def trace(fn, dirs: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(module, function)`` of each call event into ``dirs`` while ``fn()`` runs."""
    me = os.path.realpath(__file__)

    @functools.cache
    def ours(filename: str) -> bool:
        path = os.path.realpath(filename)
        return path != me and path.startswith(dirs)

    calls = []

    def profile(frame, event, arg):
        if event == "call" and ours(frame.f_code.co_filename):
            calls.append((frame.f_globals.get("__name__", "?"), frame.f_code.co_name))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def collapse(names: list[str]) -> list[str]:
    """``names`` with consecutive repeats collapsed: ``a a b b a`` -> ``a b a``."""
    return [m for i, m in enumerate(names) if i == 0 or names[i - 1] != m]


def returns(path: list[str]) -> int:
    """Steps of ``path`` into a module that already appeared earlier in it."""
    seen, count = set(), 0
    for module in path:
        count += module in seen
        seen.add(module)
    return count


def main(argv=None):
    args = parse(argv)
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", args.devices)
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg

    n = args.n
    mesh = jax.make_mesh((args.devices,), ("x",))
    m = jax.random.normal(jax.random.key(0), (n, n), dtype=jnp.float64)
    A = jax.device_put(m @ m.T + n * jnp.eye(n), NamedSharding(mesh, P("x", None)))
    b = jax.device_put(jnp.ones(n), NamedSharding(mesh, P()))

    calls = trace(lambda: jax.jit(jaxmg.potrs).lower(A, b), package_dirs())
    path = collapse([module for module, _ in calls])
    result = {
        "calls": len(calls),
        "modules": len(set(path)),
        "returns": returns(path),
        "path": path,
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"N={n} on {args.devices} CPU devices, jax.jit(jaxmg.potrs).lower(A, b):")
    print(f"  calls:   {result['calls']}")
    print(f"  modules: {result['modules']}")
    print(f"  returns: {result['returns']} (of {len(path) - 1} steps between modules)")
    print("  path:    " + " > ".join(path))
    if args.functions:
        for module, names in steps(calls):
            print(f"  {module}: {', '.join(names)}")


def steps(calls: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """The path's steps, each with the functions called in it, in order."""
    out = []
    for module, function in calls:
        if out and out[-1][0] == module:
            out[-1][1].append(function)
        else:
            out.append((module, [function]))
    return out


if __name__ == "__main__":
    main()
