"""``python -m jaxmg demo``: solve one random Hermitian positive definite system on every device,
and time JAX's own solver on one device beside it.

The demo is a program, not the library: it may configure JAX for its own process. It asks for
4 simulated CPU devices (used only when no GPU is visible) and enables x64 for float64. It needs
nothing but ``jaxmg`` and ``jaxmg-layout``: without ``jaxmg-cuda`` the default backend is
``"jax"``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import sys
import time


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m jaxmg", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="solve A x = b with jaxmg.potrs on every device, beside JAX on one"
    )
    demo.add_argument("--n", type=int, default=2048, help="matrix size N (default 2048)")
    demo.add_argument(
        "--tile", type=int, default=None, help="tile size T_A (default: jaxmg chooses)"
    )
    demo.add_argument(
        "--dtype",
        default="float64",
        choices=["float32", "float64", "complex64", "complex128"],
    )
    demo.add_argument(
        "--backend",
        default=None,
        choices=["mg", "mp", "jax"],
        help="jaxmg's engine (default: jaxmg chooses, docs/backends.md)",
    )
    demo.add_argument(
        "--repeat", type=int, default=5, help="timed runs of each, after a warm-up (default 5)"
    )
    demo.add_argument(
        "--cpu-devices", type=int, default=4, help="simulated CPU devices without a GPU"
    )
    return parser.parse_args(argv)


def _engine_label(where) -> str:
    """``backend "mg" (cuSolverMg, 1D)`` and the like: the engine that solves, as it names
    itself."""
    return f'backend "{where.backend}" ({where.engine.summary})'


def main(argv=None) -> int:
    args = _parse(argv)
    import jax

    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    jax.config.update("jax_enable_x64", True)
    import jax.scipy.linalg as jsl
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg
    from jaxmg import engines

    devices = jax.devices()
    mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)
    n, dtype = args.n - args.n % len(devices), np.dtype(args.dtype)

    rng = np.random.default_rng(0)
    m = rng.standard_normal((n, n))
    if dtype.kind == "c":
        m = m + 1j * rng.standard_normal((n, n))
    a_host = (m @ m.conj().T / n + np.eye(n)).astype(dtype)
    b_host = rng.standard_normal((n, 1)).astype(dtype)
    a = jax.device_put(a_host, NamedSharding(mesh, P("x", None)))  # by rows, every device
    b = jax.device_put(b_host, NamedSharding(mesh, P()))
    try:  # the engine that solves; one asked for by name may not be installed or fit here
        where = engines.resolve(a, backend=args.backend, caller="python -m jaxmg demo")
    except (ImportError, ValueError) as error:
        print(error, file=sys.stderr)
        return 2

    def sharded(a, b):  # jaxmg on every device of the mesh
        return jaxmg.potrs(a, b, T_A=args.tile, return_status=True, backend=args.backend)

    def dense(a, b):  # JAX's own on one device: the baseline of docs/performance.md
        return jsl.cho_solve(jsl.cho_factor(a, lower=True), b)

    jaxmg_solve = jax.jit(sharded)
    x, status = jax.block_until_ready(jaxmg_solve(a, b))  # compile and warm up

    jax_solve, jax_failed = jax.jit(dense), None
    try:  # one device must hold all of A: jaxmg exists for when it cannot
        a_one, b_one = jax.device_put(a_host, devices[0]), jax.device_put(b_host, devices[0])
        jax.block_until_ready(jax_solve(a_one, b_one))
    except jax.errors.JaxRuntimeError as error:
        jax_failed = str(error).splitlines()[0]

    def seconds(solve, *operands):
        start = time.perf_counter()
        jax.block_until_ready(solve(*operands))
        return time.perf_counter() - start

    times, jax_times = [], []
    for _ in range(max(args.repeat, 1)):  # alternately, so that both see the same machine
        times.append(seconds(jaxmg_solve, a, b))
        if jax_failed is None:
            jax_times.append(seconds(jax_solve, a_one, b_one))

    x_host = np.asarray(x)
    eps = np.finfo(dtype).eps
    residual = np.linalg.norm(a_host @ x_host - b_host) / (
        np.linalg.norm(a_host, 1) * np.linalg.norm(x_host) * n * eps
    )
    elapsed = statistics.median(times)
    runs = f"median of {len(times)} warm runs"
    tile = "automatic" if args.tile is None else args.tile
    print(f"jaxmg {importlib.metadata.version('jaxmg')} potrs demo")
    print(f"  N = {n}, T_A = {tile}, dtype = {dtype.name}, A sharded by rows")
    print(f"  devices: {len(devices)} x {devices[0].device_kind}, {_engine_label(where)}")
    print(f"  status = {int(status)}")
    print(f"  scaled residual ||Ax-b|| / (||A|| ||x|| N eps) = {residual:.3g} (passes if < 30)")
    print(f"  jaxmg on {len(devices)} devices: {elapsed * 1e3:.1f} ms ({runs})")
    if jax_failed is None:
        reference = statistics.median(jax_times)
        print(
            f"  JAX on one device (cho_factor + cho_solve): {reference * 1e3:.1f} ms ({runs}); "
            f"jaxmg / JAX = {elapsed / reference:.2f}"
        )
    else:
        print(f"  JAX on one device (cho_factor + cho_solve): failed: {jax_failed}")
    return 0 if residual < 30 and int(status) == 0 else 1
