"""One rank of an ``mpiexec -n P`` job: MKL's ScaLAPACK, loaded from pip wheels, on a process
grid, with the matrix laid out by :class:`jaxmg_layout.BlockCyclic2D`; results against numpy.

Usage: ``mpiexec -n P python worker.py ROWSxCOLS TILE RESULTS.jsonl``. Rank 0 writes one JSON
line per check. What it establishes for jaxmg's multi-node backend (issue 17): the load order
of the wheels' libraries, BLACS over MPICH, and that jaxmg's 2D layout is ScaLAPACK's.
"""

import ctypes
import json
import os
import sys

import numpy as np
from mpi4py import MPI

from jaxmg_layout import BlockCyclic2D

# The wheels' libraries, in dependency order, global so that each finds the ones before it:
# MPICH's libmpi (for BLACS), then MKL's core, threading, interface, BLACS and ScaLAPACK.
LIBRARIES = (
    "libmpi.so.12",
    "libmkl_core.so.3",
    "libmkl_sequential.so.3",
    "libmkl_intel_lp64.so.3",
    "libmkl_blacs_intelmpi_lp64.so.2",
    "libmkl_scalapack_lp64.so.2",
)


def load():
    folder = os.path.join(sys.prefix, "lib")
    for name in LIBRARIES:
        ctypes.CDLL(os.path.join(folder, name), mode=ctypes.RTLD_GLOBAL | os.RTLD_LAZY)
    return ctypes.CDLL(None)  # every symbol loaded so far


SC = load()
INT = ctypes.c_int


def ref(value):
    return ctypes.byref(INT(value))


def ptr(array):
    return array.ctypes.data_as(ctypes.c_void_p)


class Grid:
    def __init__(self, rows, cols):
        self.context = INT()
        SC.blacs_get_(ref(-1), ref(0), ctypes.byref(self.context))
        SC.blacs_gridinit_(ctypes.byref(self.context), b"R", ref(rows), ref(cols))
        shape, me = (INT(), INT()), (INT(), INT())
        SC.blacs_gridinfo_(
            ctypes.byref(self.context), *map(ctypes.byref, shape), *map(ctypes.byref, me)
        )
        self.me = (me[0].value, me[1].value)

    def descriptor(self, plan):
        desc, info = (INT * 9)(), INT()
        lld = plan.leading_dimension(self.me[0])
        SC.descinit_(desc, ref(plan.M), ref(plan.N), ref(plan.tile), ref(plan.tile), ref(0),
                     ref(0), ctypes.byref(self.context), ref(lld), ctypes.byref(info))  # fmt: skip
        assert info.value == 0, info.value
        return desc


def local(plan, a, grid):
    block = plan.local_block(a, *grid.me)
    lld = plan.leading_dimension(grid.me[0])
    out = np.zeros((lld, max(block.shape[1], 1)), a.dtype, order="F")
    out[: block.shape[0], : block.shape[1]] = block
    return out


def gathered(plan, array, grid, comm):
    """The global matrix on rank 0 from every rank's local array (None elsewhere)."""
    rows, cols = plan.local_shape(*grid.me)
    pieces = comm.gather((grid.me, np.ascontiguousarray(array[:rows, :cols])), root=0)
    if comm.rank != 0:
        return None
    blocks = [[None] * plan.cols for _ in range(plan.rows)]
    for (pr, pc), piece in pieces:
        blocks[pr][pc] = piece
    return plan.assemble(blocks)


def eigensolve(p, n, a_loc, z_loc, w, desc):
    """Eigenvalues into ``w`` and vectors into ``z_loc`` (``A``'s layout); returns ``info``."""
    info = INT()
    routine = getattr(SC, "pdsyevd_" if p == "d" else "pzheevd_")

    def call(work, rwork, iwork, query=False):
        lwork, lrwork, liwork = (-1 if query else len(x) for x in (work, rwork, iwork))
        args = [b"V", b"L", ref(n), ptr(a_loc), ref(1), ref(1), desc, ptr(w), ptr(z_loc),
                ref(1), ref(1), desc, ptr(work), ref(lwork)]  # fmt: skip
        if p == "z":
            args += [ptr(rwork), ref(lrwork)]
        routine(*args, ptr(iwork), ref(liwork), ctypes.byref(info))

    work, rwork, iwork = np.zeros(1, a_loc.dtype), np.zeros(1), np.zeros(1, np.int32)
    call(work, rwork, iwork, query=True)
    call(
        np.zeros(int(work[0].real) + 1, a_loc.dtype),
        np.zeros(int(rwork[0]) + 1),
        np.zeros(int(iwork[0]) + 1, np.int32),
    )
    return info.value


def run(grid_shape, tile, comm, report):
    rows, cols = grid_shape
    grid = Grid(rows, cols)
    n, nrhs = 13, 2
    rng = np.random.default_rng(0)
    for dtype, p in ((np.float64, "d"), (np.complex128, "z")):
        m = rng.standard_normal((n, n)) + (1j * rng.standard_normal((n, n)) if p == "z" else 0)
        hpd = (m @ m.conj().T + n * np.eye(n)).astype(dtype)
        general = (m + 2 * np.eye(n)).astype(dtype)
        b = rng.standard_normal((n, nrhs)).astype(dtype)
        plan, plan_b = (
            BlockCyclic2D.make(n, n, grid_shape, tile),
            BlockCyclic2D.make(n, nrhs, grid_shape, tile),
        )
        da, db = grid.descriptor(plan), grid.descriptor(plan_b)
        info = INT()
        case = {"dtype": np.dtype(dtype).name, "grid": f"{rows}x{cols}", "tile": tile}

        # Cholesky: p?potrf, p?potrs.
        a_loc, b_loc = local(plan, hpd, grid), local(plan_b, b, grid)
        getattr(SC, f"p{p}potrf_")(b"L", ref(n), ptr(a_loc), ref(1), ref(1), da, ctypes.byref(info))
        factored = info.value
        getattr(SC, f"p{p}potrs_")(b"L", ref(n), ref(nrhs), ptr(a_loc), ref(1), ref(1), da,
                                   ptr(b_loc), ref(1), ref(1), db, ctypes.byref(info))  # fmt: skip
        x = gathered(plan_b, b_loc, grid, comm)
        factor = gathered(plan, a_loc, grid, comm)
        if comm.rank == 0:
            lower = np.tril(factor)
            ok = factored == 0 and info.value == 0
            ok = ok and np.allclose(lower, np.linalg.cholesky(hpd), atol=1e-10 * n)
            report("potrs", ok and np.allclose(hpd @ x, b, atol=1e-10 * n), **case)

        # LU with partial pivoting: p?getrf, p?getrs (A^T for the transposed solve).
        a_loc, b_loc = local(plan, general, grid), local(plan_b, b, grid)
        ipiv = np.zeros(plan.local_shape(*grid.me)[0] + tile, np.int32)
        getattr(SC, f"p{p}getrf_")(ref(n), ref(n), ptr(a_loc), ref(1), ref(1), da, ptr(ipiv),
                                   ctypes.byref(info))  # fmt: skip
        getattr(SC, f"p{p}getrs_")(b"T", ref(n), ref(nrhs), ptr(a_loc), ref(1), ref(1), da,
                                   ptr(ipiv), ptr(b_loc), ref(1), ref(1), db,
                                   ctypes.byref(info))  # fmt: skip
        x = gathered(plan_b, b_loc, grid, comm)
        if comm.rank == 0:
            report("getrs", info.value == 0 and np.allclose(general.T @ x, b, atol=1e-9), **case)

        # The Hermitian eigensolver: p?syevd / p?heevd, workspace queried first.
        a_loc = local(plan, hpd, grid)
        z_loc = np.zeros_like(a_loc)
        w = np.zeros(n, np.float64)
        status = eigensolve(p, n, a_loc, z_loc, w, da)
        v = gathered(plan, z_loc, grid, comm)
        if comm.rank == 0:
            values = np.allclose(w, np.linalg.eigvalsh(hpd), atol=1e-10 * n * n)
            vectors = np.allclose(hpd @ v, v * w, atol=1e-9 * n * n)
            report("syevd", status == 0 and values and vectors, **case)
    SC.blacs_gridexit_(ctypes.byref(grid.context))


def main(grid_text, tile, results):
    comm = MPI.COMM_WORLD
    rows, cols = (int(v) for v in grid_text.split("x"))
    assert rows * cols == comm.size, (grid_text, comm.size)
    lines = []

    def report(check, ok, **extra):
        lines.append(json.dumps({"check": check, "ok": bool(ok), **extra}))

    run((rows, cols), int(tile), comm, report)
    if comm.rank == 0:
        with open(results, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:4])
