"""The relayout to ScaLAPACK's 2D block-cyclic layout across processes: JAX's against ScaLAPACK's
own redistribution routine, both against a plain copy, in the same job.

For each grid and tile, one ``mpiexec -n P`` job (one CPU device per process) times, on the
same ``N x N`` float64 matrix sharded ``P(r, c)`` (or ``P(None, c)`` on a ``1 x P`` grid):

- ``jax``: jaxmg's round trip, ``undo_cyclic_2d_layout(cyclic_2d_layout(a, T), T, N)`` under
  ``jit`` (the JAX collectives ``backend="mp"`` runs before and after the engine);
- ``pdgemr2d``: ScaLAPACK's ``pdgemr2d`` from the block distribution (``MB = N / rows``,
  ``NB = N / cols``, each process's block as it is) to square ``T x T`` tiles and back, into
  a second local array and back (it works out of place);
- ``copy``: ``jit(lambda a: a + 0)`` on the sharded matrix, one read and one write of each
  block;
- and what each costs a solve: ``jaxmg.potrs(a, b, T_A=T)`` (jitted, one right-hand side, on a
  symmetric positive definite matrix) with ``relayout="native"`` (the engine's ``pdgemr2d``
  there and back) and ``relayout="jax"`` (JAX's relayout there; the factor stays tiled).

Median of ``--runs`` after ``--warmup``; ratios are against the copy. Every round trip is
checked to return the matrix unchanged.

    python benchmarks/relayout_mp.py --n 4096 --grids 2x2 1x4 --tiles 64 256 \\
        --json benchmarks/results/relayout_mp_cpu.jsonl
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys

from _common import start_mpi_jax, timed_calls

HERE = os.path.abspath(__file__)


def worker(args) -> None:
    jax = start_mpi_jax()
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg
    import jaxmg_cuda
    import jaxmg_layout as jl

    n, tile, rows = args.n, args.tile, args.grid_rows
    cols = jax.process_count() // rows
    mesh = jax.make_mesh((rows, cols), ("r", "c"))
    spec = P("r", "c") if rows > 1 else P(None, "c")
    rng = np.random.default_rng(0)
    full = rng.standard_normal((n, n)) / np.sqrt(n)
    full = full @ full.T + np.eye(n)  # positive definite, for the solves
    A = jax.make_array_from_callback((n, n), NamedSharding(mesh, spec), lambda i: full[i])
    result = {"N": n, "grid": f"{rows}x{cols}", "tile": tile}

    if rows > 1:
        trip = jax.jit(lambda a: jl.undo_cyclic_2d_layout(jl.cyclic_2d_layout(a, tile), tile, n))
    else:
        trip = jax.jit(lambda a: jl.undo_cyclic_1d_layout(jl.cyclic_1d_layout(a, tile), tile, n))
    copy = jax.jit(lambda a: a + 0)
    back = trip(A)
    same = np.array_equal(np.asarray(back.addressable_data(0)), np.asarray(A.addressable_data(0)))
    result["jax_s"] = timed_calls(lambda: trip(A).block_until_ready(), args.warmup, args.runs)[0]
    result["copy_s"] = timed_calls(lambda: copy(A).block_until_ready(), args.warmup, args.runs)[0]
    b = np.ones((n, 1))
    with jax.set_mesh(mesh):
        for relayout in ("native", "jax"):
            solve = jax.jit(lambda a, r, how=relayout: jaxmg.potrs(a, r, T_A=tile, relayout=how))
            x = solve(A, b)
            same = same and float(np.max(np.abs(full @ np.asarray(x) - b))) < 1e-8
            seconds = timed_calls(
                lambda solve=solve: solve(A, b).block_until_ready(), args.warmup, args.runs
            )
            result[f"potrs_{relayout}_s"] = seconds[0]

    jaxmg_cuda.mp.load()
    lib, Int = ctypes.CDLL(None), ctypes.c_int
    ref = lambda v: ctypes.byref(Int(v))  # noqa: E731
    context, nprow, npcol, me_r, me_c, info = Int(), Int(), Int(), Int(), Int(), Int()
    lib.blacs_get_(ref(-1), ref(0), ctypes.byref(context))
    lib.blacs_gridinit_(ctypes.byref(context), b"R", ref(rows), ref(cols))
    lib.blacs_gridinfo_(ctypes.byref(context), *map(ctypes.byref, (nprow, npcol, me_r, me_c)))
    lib.numroc_.restype = Int
    block = np.asfortranarray(np.asarray(A.addressable_data(0)))  # [N/rows, N/cols]
    local_r = lib.numroc_(ref(n), ref(tile), ref(me_r.value), ref(0), ref(rows))
    local_c = lib.numroc_(ref(n), ref(tile), ref(me_c.value), ref(0), ref(cols))
    cyclic = np.zeros((max(local_r, 1), max(local_c, 1)), order="F")
    desc_block, desc_cyclic = (Int * 9)(), (Int * 9)()
    lib.descinit_(desc_block, ref(n), ref(n), ref(n // rows), ref(n // cols), ref(0), ref(0),
                  ctypes.byref(context), ref(n // rows), ctypes.byref(info))  # fmt: skip
    lib.descinit_(desc_cyclic, ref(n), ref(n), ref(tile), ref(tile), ref(0), ref(0),
                  ctypes.byref(context), ref(max(local_r, 1)), ctypes.byref(info))  # fmt: skip
    original = block.copy(order="F")

    def gemr2d(clear=False):
        pointer = ctypes.c_void_p
        lib.pdgemr2d_(ref(n), ref(n), block.ctypes.data_as(pointer), ref(1), ref(1), desc_block,
                      cyclic.ctypes.data_as(pointer), ref(1), ref(1), desc_cyclic,
                      ctypes.byref(context))  # fmt: skip
        if clear:  # the check: what comes back must come from the cyclic copy
            block[...] = 0
        lib.pdgemr2d_(ref(n), ref(n), cyclic.ctypes.data_as(pointer), ref(1), ref(1),
                      desc_cyclic, block.ctypes.data_as(pointer), ref(1), ref(1), desc_block,
                      ctypes.byref(context))  # fmt: skip

    gemr2d(clear=True)
    expected = jl.BlockCyclic2D.for_blocks(n, (rows, cols), tile)
    cyclic_ok = np.array_equal(
        cyclic[:local_r, :local_c], expected.local_block(full, me_r.value, me_c.value)
    )
    same = same and cyclic_ok and np.array_equal(block, original)
    result["pdgemr2d_s"] = timed_calls(gemr2d, args.warmup, args.runs)[0]
    result["ok"] = bool(np.all(multihost_utils.process_allgather(np.int32(same))))
    names = ["jax_s", "pdgemr2d_s", "copy_s", "potrs_native_s", "potrs_jax_s"]
    slowest = multihost_utils.process_allgather(np.array([result[k] for k in names])).max(0)
    result.update({k: float(v) for k, v in zip(names, slowest, strict=True)})
    if jax.process_index() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    jax.distributed.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--grids", nargs="+", default=["2x2", "1x4"])
    parser.add_argument("--tiles", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tile", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--grid-rows", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    mpiexec = os.path.join(sys.prefix, "bin", "mpiexec")
    results, failed = [], False
    for grid in args.grids:
        rows, cols = (int(v) for v in grid.split("x"))
        for tile in args.tiles:
            command = [mpiexec, "-n", str(rows * cols), sys.executable, HERE, "--worker"]
            command += ["--n", str(args.n), "--tile", str(tile), "--grid-rows", str(rows)]
            command += ["--runs", str(args.runs), "--warmup", str(args.warmup)]
            done = subprocess.run(
                command, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1")
            )
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode != 0 or not lines:
                sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
                raise SystemExit(f"the job on a {grid} grid with tile {tile} failed")
            r = json.loads(lines[0][len("RESULT ") :])
            failed |= not r["ok"]
            results.append(r)
    print(f"N = {args.n}, float64, round trip block -> T x T tiles -> block; "
          f"slowest process, median of {args.runs}; {os.cpu_count()} cores")  # fmt: skip
    print("| grid | tile | JAX relayout (s) | pdgemr2d (s) | copy (s) | JAX / copy | "
          "pdgemr2d / copy | potrs, native (s) | potrs, jax (s) | exact |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(
            f"| {r['grid']} | {r['tile']} | {r['jax_s']:.3f} | {r['pdgemr2d_s']:.3f} | "
            f"{r['copy_s']:.4f} | {r['jax_s'] / r['copy_s']:.1f} | "
            f"{r['pdgemr2d_s'] / r['copy_s']:.1f} | {r['potrs_native_s']:.3f} | "
            f"{r['potrs_jax_s']:.3f} | {r['ok']} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in results))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
