"""jaxmg's distributed engine, ``backend="mp"``: one process per device, ScaLAPACK over MPI on
CPUs (no GPU needed). From a clone of this repository,
``pip install ./packages/jaxmg-layout ./packages/jaxmg-cuda './packages/jaxmg[mpi]'`` brings
jaxmg's native engines, MKL's ScaLAPACK, MPICH and mpi4py.

    mpiexec -n 4 python examples/multi_node.py      # as on a cluster: one process per device
    python examples/multi_node.py                   # the same: it starts mpiexec -n 4 itself
    python examples/multi_node.py --processes 2 --n 2000

Each process initialises ``jax.distributed`` from MPI and owns one CPU device; the processes may
be on different nodes (``mpiexec -hosts a,b ...``). The processes form the squarest grid there
is (2 x 2 for 4 processes, 1 x 2 for 2) and ``A`` is sharded over it, ``P(r, c)``: ScaLAPACK's
2D block-cyclic layout. ``A`` is built where it lives: each process makes only its own block of
a kernel matrix, so no process ever holds more than ``N^2 / P`` of it. Then ``potrs`` (with
the log-determinant), ``lu_solve`` and ``syevd`` solve on all processes together, and each
process prints True when the residuals, computed on the mesh, are small.
"""

import argparse
import os
import shutil
import subprocess
import sys


def under_mpi() -> bool:
    return any(v in os.environ for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"))


def launch(args) -> int:
    mpiexec = os.path.join(sys.prefix, "bin", "mpiexec")
    mpiexec = mpiexec if os.path.exists(mpiexec) else shutil.which("mpiexec")
    if mpiexec is None:
        sys.exit(
            "no mpiexec: pip install mkl mpich mpi4py (or, from a clone of this repository, "
            "pip install ./packages/jaxmg-layout ./packages/jaxmg-cuda './packages/jaxmg[mpi]')"
        )
    command = [mpiexec, "-n", str(args.processes), sys.executable, __file__, "--n", str(args.n)]
    return subprocess.run(command, env=dict(os.environ, OMP_NUM_THREADS="1")).returncode


def run(args) -> None:
    # Gloo (the CPU collectives) prints to the C-level stdout: send it to stderr.
    sys.stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(cluster_detection_method="mpi4py")

    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg

    processes, me = jax.process_count(), jax.process_index()
    rows = max(r for r in range(1, int(processes**0.5) + 1) if processes % r == 0)
    n = args.n - args.n % processes  # N divisible by both extents of the grid
    mesh = jax.make_mesh((rows, processes // rows), ("r", "c"))  # process (i, j): i * cols + j
    blocks = NamedSharding(mesh, P("r", "c") if rows > 1 else P(None, "c"))
    points = jnp.linspace(0.0, 1.0, n)

    def kernel(index):  # the block `index` of K + I, built by the process that holds it
        x = points[index[0]][:, None]
        y = points[index[1]][None, :]
        k = jnp.exp(-((x - y) ** 2) / 0.02)
        return k + (x == y)

    K = jax.make_array_from_callback((n, n), blocks, kernel)
    b = jnp.ones((n, 1))
    with jax.set_mesh(mesh):
        x, logdet, status = jaxmg.potrs(K, b, backend="mp", return_logdet=True, return_status=True)
        residual = jnp.max(jnp.abs(K @ x - b))
        y = jaxmg.lu_solve(K, b, trans=1, backend="mp")
        lu_residual = jnp.max(jnp.abs(K.T @ y - b))
        w = jaxmg.syevd(K, backend="mp", return_eigenvectors=False)
        # K + I is positive definite and its eigenvalues multiply to its determinant.
        logdet_from_w = jnp.sum(jnp.log(w))
    ok = (
        int(status) == 0
        and float(residual) < 1e-8
        and float(lu_residual) < 1e-8
        and abs(float(logdet) - float(logdet_from_w)) < 1e-8 * n
    )
    print(
        f"process {me}/{processes} of a {rows} x {processes // rows} grid: N={n}, "
        f"status={int(status)}, |Kx-b|={float(residual):.1e}, "
        f"|K^T y-b|={float(lu_residual):.1e}, logdet={float(logdet):.6f} "
        f"(from eigenvalues {float(logdet_from_w):.6f}), {n * n // processes} entries of K here",
        flush=True,
    )
    print(ok, flush=True)
    jax.distributed.shutdown()
    if not ok:
        sys.exit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4, help="without mpiexec: how many")
    parser.add_argument("--n", type=int, default=1000, help="the order of K (rounded down)")
    args = parser.parse_args()
    if under_mpi():
        run(args)
    else:
        sys.exit(launch(args))


if __name__ == "__main__":
    main()
