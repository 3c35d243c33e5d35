"""Benchmark ``backend="mp"`` (ScaLAPACK over MPI, one process per device) on CPUs.

In the same run, for each process count P (``mpiexec -n P``, one CPU device per process), on a
``1 x P`` grid and on each square grid of ``--grids``:

- ``jaxmg``: ``jax.jit(lambda a, b: jaxmg.potrs(a, b, backend="mp"))`` on ``A`` sharded
  ``P(None, 'c')`` (``1 x P``) or ``P('r', 'c')`` (a grid), square tiles of ``--tile``
  (default ``N / cols``: the blocks, no relayout; a smaller one makes the engine relay the
  blocks itself, with ``pdgemr2d``). ``A`` is not donated, so XLA copies it into the call's
  output first, as it would in a user's program;
- ``scalapack``: the same ScaLAPACK routines called directly (``pdpotrf`` + ``pdpotrs`` through
  ctypes, as ``tests/mpi/worker.py`` does) on the same grid, tile and data, each process's
  local array of the tiled layout built where it lives, each run starting from a fresh copy of
  it (what jaxmg's call also does);
- ``jax``: JAX's own ``jnp.linalg.cholesky`` + ``cho_solve`` on the same sharded ``A`` (XLA
  gathers ``A`` onto every device to factor it): time and memory.

Memory: each variant runs in a job of its own and, compiled but not yet run, measures its
first run's peak resident memory above what the process held just before it (``A``'s block
included there), against ``8 N^2 / P`` (one float64 block of ``A``): the solve's transient
memory per process. Timing: ``--warmup`` untimed runs, then the median (and spread) of ``--runs``.
The overhead ratio is jaxmg / scalapack at the same P (the issue's target: at most 1.10 at
N = 4096 on 4 processes). Checks: every solution's residual ``|A x - b| / |b|`` below 1e-10,
else the exit status is 1. This machine's core count is printed: more processes than cores
share them, so the scaling column measures the library's overheads there, not speed-up.

    python benchmarks/multi_node.py --n 4096 --processes 1 2 4 --grids 2x2 \\
        --json benchmarks/results/multi_node_cpu.jsonl \\
        --markdown benchmarks/results/multi_node_cpu.md
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys

from _common import start_mpi_jax, timed_calls

HERE = os.path.abspath(__file__)


def status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status (``VmHWM``: the peak resident
    memory, ``VmRSS``: the resident memory now), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def first_run_bytes(fn) -> int:
    """Peak resident memory of ``fn()`` above what the process held before it: the peak is
    reset first (``/proc/self/clear_refs``); run it before any other run, so that no freed
    memory of an earlier run hides its allocations."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = status_bytes("VmRSS")
    fn()
    return status_bytes("VmHWM") - before


def worker(args) -> None:
    jax = start_mpi_jax()
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg
    import jaxmg_cuda
    from jaxmg_layout import BlockCyclic2D

    processes, rank, n = jax.process_count(), jax.process_index(), args.n
    grid_rows = args.grid_rows
    grid_cols = processes // grid_rows
    # JAX's own cholesky refuses Explicit axes (its transposes would be ambiguous): Auto there.
    auto = (jax.sharding.AxisType.Auto,) * 2 if args.variant == "jax" else None
    mesh = jax.make_mesh((grid_rows, grid_cols), ("r", "c"), axis_types=auto)
    spec = P("r", "c") if grid_rows > 1 else P(None, "c")
    points = np.linspace(0.0, 1.0, n)

    def block(index):
        x, y = points[index[0]][:, None], points[index[1]][None, :]
        return np.exp(-((x - y) ** 2) / 0.02) + (x == y)

    A = jax.make_array_from_callback((n, n), NamedSharding(mesh, spec), block)
    b = np.ones((n, 1))
    result = {"variant": args.variant, "processes": processes, "grid": [grid_rows, grid_cols]}
    result["n"] = n

    if args.variant == "jaxmg":
        with jax.set_mesh(mesh):
            tile = args.tile or n // grid_cols
            solve = jax.jit(lambda a, r: jaxmg.potrs(a, r, T_A=tile, backend="mp"))
            solve = solve.lower(A, b).compile()
            result["extra_bytes"] = first_run_bytes(lambda: solve(A, b).block_until_ready())
            x = solve(A, b)
            result["time"] = timed_calls(
                lambda: solve(A, b).block_until_ready(), args.warmup, args.runs
            )
            residual = jnp.linalg.norm(A @ x - b) / np.linalg.norm(b)
    elif args.variant == "jax":

        def cholesky_solve(a, r):
            return jax.scipy.linalg.cho_solve((jnp.linalg.cholesky(a), True), r)

        solve = jax.jit(cholesky_solve).lower(A, b).compile()
        result["extra_bytes"] = first_run_bytes(lambda: solve(A, b).block_until_ready())
        x = solve(A, b)
        result["time"] = timed_calls(
            lambda: solve(A, b).block_until_ready(), args.warmup, args.runs
        )
        residual = jnp.linalg.norm(A @ x - b) / np.linalg.norm(b)
    else:  # ScaLAPACK called directly, on this process's block
        jaxmg_cuda.mp.load()
        lib, Int = ctypes.CDLL(None), ctypes.c_int
        ref = lambda v: ctypes.byref(Int(v))  # noqa: E731
        context, rows, cols, me_r, me_c = Int(), Int(), Int(), Int(), Int()
        lib.blacs_get_(ref(-1), ref(0), ctypes.byref(context))
        lib.blacs_gridinit_(ctypes.byref(context), b"R", ref(grid_rows), ref(grid_cols))
        lib.blacs_gridinfo_(ctypes.byref(context), *map(ctypes.byref, (rows, cols, me_r, me_c)))
        # This process's local array of the block-cyclic layout, column-major, built where it
        # lives (with the block tile N / cols it is its block of P(r, c)).
        tile = args.tile or n // grid_cols
        layout = BlockCyclic2D.make(n, n, (grid_rows, grid_cols), tile)
        mine = layout.row_map(me_r.value)
        local = np.asfortranarray(block((mine, layout.col_map(me_c.value))))
        lld = max(1, mine.size)
        desc_a, desc_b, info = (Int * 9)(), (Int * 9)(), Int()
        lib.descinit_(desc_a, ref(n), ref(n), ref(tile), ref(tile), ref(0), ref(0),
                      ctypes.byref(context), ref(lld), ctypes.byref(info))  # fmt: skip
        lib.descinit_(desc_b, ref(n), ref(1), ref(tile), ref(1), ref(0), ref(0),
                      ctypes.byref(context), ref(lld), ctypes.byref(info))  # fmt: skip
        work = np.empty_like(local)
        rhs = np.empty((lld, 1), order="F")  # b's rows of this process row, on column 0

        def solve():
            work[...] = local
            rhs[...] = 0
            if me_c.value == 0:
                rhs[: mine.size] = b[mine]
            lib.pdpotrf_(b"L", ref(n), work.ctypes.data_as(ctypes.c_void_p), ref(1), ref(1),
                         desc_a, ctypes.byref(info))  # fmt: skip
            lib.pdpotrs_(b"L", ref(n), ref(1), work.ctypes.data_as(ctypes.c_void_p), ref(1),
                         ref(1), desc_a, rhs.ctypes.data_as(ctypes.c_void_p), ref(1), ref(1),
                         desc_b, ctypes.byref(info))  # fmt: skip
            return info.value

        result["extra_bytes"] = first_run_bytes(solve)
        assert solve() == 0
        result["time"] = timed_calls(solve, args.warmup, args.runs)
        parts = np.asarray(multihost_utils.process_allgather(rhs))  # [P, lld, 1], row-major
        x = np.zeros((n, 1))
        for r in range(grid_rows):  # process (r, 0) holds the rows of its process row
            x[layout.row_map(r)] = parts[r * grid_cols][: layout.row_map(r).size]
        residual = jnp.linalg.norm(A @ x - b) / np.linalg.norm(b)
    result["residual"] = float(residual)
    peaks = multihost_utils.process_allgather(np.int64(result["extra_bytes"]))
    result["extra_bytes"] = int(np.max(peaks))  # the largest process's
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    jax.distributed.shutdown()


def run_job(args, grid, variant):
    mpiexec = os.path.join(sys.prefix, "bin", "mpiexec")
    processes = grid[0] * grid[1]
    command = [mpiexec, "-n", str(processes), sys.executable, HERE, "--worker", variant]
    command += ["--grid-rows", str(grid[0]), "--tile", str(args.tile)]
    command += ["--n", str(args.n), "--runs", str(args.runs), "--warmup", str(args.warmup)]
    done = subprocess.run(
        command, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1")
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        raise SystemExit(f"job {variant} on a {grid[0]} x {grid[1]} grid failed")
    return json.loads(lines[0][len("RESULT ") :])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--grids", nargs="*", default=["2x2"], help="square grids, e.g. 2x2")
    parser.add_argument("--grid-rows", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument(
        "--tile",
        type=int,
        default=0,
        help="square tile of every variant (0: N / cols, no relayout)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--worker", choices=("jaxmg", "scalapack", "jax"))
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    if args.worker:
        args.variant = args.worker
        return worker(args)
    grids = [(1, p) for p in args.processes]
    for text in args.grids:
        rows, cols = (int(v) for v in text.split("x"))
        if rows != cols:
            parser.error(f"--grids takes square grids (the direct call's tile), got {text}")
        grids.append((rows, cols))
    results, failed = [], False
    for grid in grids:
        for variant in ("jaxmg", "scalapack", "jax"):
            r = run_job(args, grid, variant)
            r["cores"] = os.cpu_count()
            failed |= not r["residual"] < 1e-10
            print(json.dumps(r), flush=True)
            results.append(r)
    block = 8 * args.n * args.n
    lines = [
        f"N = {args.n}, float64, potrs with one right-hand side, tile "
        + (str(args.tile) if args.tile else "N / cols (no relayout)")
        + f"; {os.cpu_count()} cores; median "
        f"of {args.runs} runs after {args.warmup} warm-up (min..max). Memory: the largest "
        "process's first solve: its peak resident memory above what it held before (A's block "
        "included), in units of 8 N^2 / P (one block of A).",
        "",
        "| grid | jaxmg mp (s) | ScaLAPACK direct (s) | jaxmg / ScaLAPACK | JAX cholesky (s) | "
        "memory jaxmg | memory ScaLAPACK | memory JAX |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for grid in grids:
        processes = grid[0] * grid[1]
        row = {r["variant"]: r for r in results if tuple(r["grid"]) == grid}
        t = {v: row[v]["time"] for v in row}
        units = block / processes
        lines.append(
            f"| {grid[0]} x {grid[1]} | "
            f"{t['jaxmg'][0]:.3f} ({t['jaxmg'][1]:.3f}..{t['jaxmg'][2]:.3f}) | "
            f"{t['scalapack'][0]:.3f} ({t['scalapack'][1]:.3f}..{t['scalapack'][2]:.3f}) | "
            f"{t['jaxmg'][0] / t['scalapack'][0]:.2f} | {t['jax'][0]:.3f} | "
            + " | ".join(
                f"{row[v]['extra_bytes'] / units:.2f}" for v in ("jaxmg", "scalapack", "jax")
            )
            + " |"
        )
    table = "\n".join(lines)
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in results))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("# backend='mp' on CPUs: jaxmg vs ScaLAPACK called directly\n\n")
            f.write(f"`python {' '.join(sys.argv)}`\n\n{table}\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
