"""A batched LAPACK call in a program of several XLA:CPU devices, in plain JAX: does it finish?

Each run is a fresh process that jits, inside ``jax.shard_map`` over ``--devices`` CPU devices,
a loop of ``--steps`` steps, each one primitive applied to a ``[batch, N, N]`` stack
(``--modes``: ``batched``, ``jax.vmap``'d; ``map``, ``lax.map`` over the batch; ``sequential``,
under ``jax.custom_batching.sequential_vmap``) followed by a ``psum`` (or, ``--collective
none``, a batched matmul), and runs it ``--calls`` times; a run that hangs is killed after
``--timeout`` seconds, unless XLA's rendezvous aborts it first (``rc -6``). The table says, per
primitive and mode, how many runs finished and their median seconds per call.

    python benchmarks/vmap_deadlock.py --n 512 --runs 3 --devices 2
    python benchmarks/vmap_deadlock.py --primitives eigh qr svd matmul --modes batched
    NPROC=3 python benchmarks/vmap_deadlock.py --modes batched sequential

Measured on a 2-core machine (jax 0.10.2, N = 512, batch 3, 2 devices): batched ``cholesky``,
``lu``, ``triangular_solve``, ``eigh``, ``qr`` and ``svd`` hung every run, ``cholesky`` also
with a matmul instead of the ``psum``; a batched matmul, ``map`` and ``sequential`` finished.
With ``NPROC=3`` (XLA's intra-op pool of 3 threads, more than the 2 devices) batched
``cholesky`` finished 3 of 3. The cause: jaxlib's LAPACK kernels wait, on a thread of that pool,
for chunks of the batch scheduled on the same pool (:mod:`jaxmg.engines._unbatched`).

``--jaxmg`` runs the program of issue 56 instead: ``jax.jit(jax.vmap(jaxmg.potrs))`` (and
``lu_solve`` after ``lu_factor``) of ``--batch`` matrices sharded ``P(None, "x", None)``, backend
``"jax"``, and prints the largest scaled residual; ``--batched-engine`` has the engine's LAPACK
calls batched on CPUs as well (what :mod:`jaxmg.engines._unbatched` prevents).

    python benchmarks/vmap_deadlock.py --jaxmg potrs lu_solve --n 512 --devices 4 --runs 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

PRIMITIVES = ("cholesky", "lu", "triangular_solve", "eigh", "qr", "svd", "matmul")
MODES = ("batched", "map", "sequential")

CHILD = r"""
import sys, time
import jax
jax.config.update("jax_num_cpu_devices", {devices})
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

n, batch, steps, calls = {n}, {batch}, {steps}, {calls}
primitive, mode, collective = {primitive!r}, {mode!r}, {collective!r}

def one(m):
    if primitive == "cholesky":
        return lax.linalg.cholesky(m)
    if primitive == "lu":
        return lax.linalg.lu(m)[0]
    if primitive == "triangular_solve":
        return lax.linalg.triangular_solve(m, m, left_side=True, lower=True)
    if primitive == "eigh":
        return lax.linalg.eigh(m)[0]
    if primitive == "qr":
        return lax.linalg.qr(m)[0]
    if primitive == "svd":
        return lax.linalg.svd(m)[0]
    return m @ m

if mode == "batched":
    stacked = jax.vmap(one)
elif mode == "map":
    stacked = lambda x: lax.map(one, x)
else:
    stacked = jax.vmap(jax.custom_batching.sequential_vmap(one))

mesh = jax.make_mesh((jax.device_count(),), ("x",))

def body(x):
    def step(i, x):
        y = stacked(x)
        y = jnp.tril(y)
        if collective == "psum":  # a small change summed over the devices
            return x + 1e-3 * lax.psum(y, "x") / jax.device_count()
        # no collective: a batched matmul instead
        return x + 1e-3 * y @ jnp.swapaxes(y, 1, 2) / n
    return lax.fori_loop(0, steps, step, x)

f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
rng = np.random.default_rng(0)
g = rng.standard_normal((batch * jax.device_count(), n, n))
a = g @ g.transpose(0, 2, 1) / n + np.eye(n)
a = jax.device_put(a, jax.sharding.NamedSharding(mesh, P("x")))
jax.block_until_ready(f(a))
start = time.perf_counter()
for _ in range(calls):
    jax.block_until_ready(f(a))
print("SECONDS", (time.perf_counter() - start) / calls)
"""

CHILD_JAXMG = r"""
import time
import jax
jax.config.update("jax_num_cpu_devices", {devices})
jax.config.update("jax_enable_x64", True)
import numpy as np
import jaxmg
from jax.sharding import NamedSharding, PartitionSpec as P
if {batched_engine}:  # the engine's LAPACK calls batched on CPUs too: the form that hangs
    from jaxmg.engines import collectives, jacobi
    collectives.unbatched = jacobi.unbatched = lambda f, *args, **options: f(*args, **options)

n, batch, calls, routine = {n}, {batch}, {calls}, {primitive!r}
mesh = jax.make_mesh((jax.device_count(),), ("x",))
rng = np.random.default_rng(0)
g = rng.standard_normal((batch, n, n))
a_np = g @ g.transpose(0, 2, 1) / n + np.eye(n)
b_np = rng.standard_normal((batch, n, 1))
a = jax.device_put(a_np, NamedSharding(mesh, P(None, "x", None)))
b = jax.device_put(b_np, NamedSharding(mesh, P()))
if routine == "potrs":
    f = jax.jit(jax.vmap(lambda a, b: jaxmg.potrs(a, b, backend="jax")))
else:
    f = jax.jit(jax.vmap(
        lambda a, b: jaxmg.lu_solve(jaxmg.lu_factor(a, backend="jax"), b, backend="jax")))
x = jax.block_until_ready(f(a, b))
start = time.perf_counter()
for _ in range(calls):
    x = jax.block_until_ready(f(a, b))
x = np.asarray(x)
res = max(
    np.linalg.norm(a_np[i] @ x[i] - b_np[i]) / (np.linalg.norm(a_np[i]) * np.linalg.norm(x[i]))
    for i in range(batch)
)
print("SECONDS", (time.perf_counter() - start) / calls, "RESIDUAL", res)
"""


def run_once(source: str, timeout: float) -> tuple[str, float | None, str]:
    """``(outcome, seconds, extra)``: ``ok`` with the child's seconds per call (and what else it
    printed), ``rc N`` (e.g. 134: aborted by XLA's rendezvous timeout) or ``timeout``."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", source], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return "timeout", None, ""
    if done.returncode:
        hint = "rendezvous" if "rendezvous" in done.stderr else done.stderr.strip()[-300:]
        return f"rc {done.returncode} ({hint})", None, ""
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("SECONDS")).split()
    return "ok", float(line[1]), " ".join(line[2:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--batch", type=int, default=3)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="loop steps (plain JAX)")
    parser.add_argument("--calls", type=int, default=2, help="timed calls per process")
    parser.add_argument("--runs", type=int, default=3, help="processes per case")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per process")
    parser.add_argument("--primitives", nargs="+", default=list(PRIMITIVES[:3]))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument(
        "--collective",
        default="psum",
        choices=("psum", "none"),
        help="what follows the primitive in each step: a psum, or a batched matmul",
    )
    parser.add_argument(
        "--jaxmg",
        nargs="*",
        choices=("potrs", "lu_solve"),
        help="jaxmg's routines under jax.vmap instead of plain JAX (default: both)",
    )
    parser.add_argument(
        "--batched-engine",
        action="store_true",
        help="with --jaxmg: the engine's LAPACK calls batched on CPUs too (as before the fix)",
    )
    args = parser.parse_args()
    if args.jaxmg is not None:
        template, cases = CHILD_JAXMG, [(r, "jaxmg") for r in args.jaxmg or ("potrs", "lu_solve")]
    else:
        template, cases = CHILD, [(p, m) for p in args.primitives for m in args.modes]
    print(
        f"N={args.n} batch={args.batch} devices={args.devices} runs={args.runs} "
        f"jax {jax_version()}, {os.cpu_count()} cores"
    )
    for primitive, mode in cases:
        source = template.format(
            devices=args.devices,
            n=args.n,
            batch=args.batch,
            steps=args.steps,
            calls=args.calls,
            primitive=primitive,
            mode=mode,
            collective=args.collective,
            batched_engine=args.batched_engine,
        )
        outcomes, seconds, extras = [], [], set()
        start = time.perf_counter()
        for _ in range(args.runs):
            outcome, s, extra = run_once(source, args.timeout)
            outcomes.append(outcome)
            if s is not None:
                seconds.append(s)
                extras.add(extra)
        wall = time.perf_counter() - start
        failed = sorted({o for o in outcomes if o != "ok"})
        median = f"{statistics.median(seconds):.3f} s/call" if seconds else "-"
        print(
            f"{primitive:>16} {mode:>10}: {len(seconds)}/{args.runs} finished, {median} "
            f"(wall {wall:.0f} s)"
            + ("; " + ", ".join(failed) if failed else "")
            + (f"; {max(extras)}" if any(extras) else ""),
            flush=True,
        )


def jax_version() -> str:
    from importlib.metadata import version

    return version("jax")


if __name__ == "__main__":
    main()
