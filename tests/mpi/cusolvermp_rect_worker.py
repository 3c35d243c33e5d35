"""One rank of an ``mpiexec -n P`` job running backend "mp"'s rectangular routines on GPUs
(csrc/engines/cusolvermp_rect.cc: qr by Geqrf + Orgqr, gels by Gels) outside XLA, through the
test hook ``run_rect_cuda_on_host``, against the emulator of the CUDA runtime, NCCL and
cuSOLVERMp in ``tests/native/fake_cuda`` (numbers from MKL's ScaLAPACK). Each rank stages its
local array of the 2D block-cyclic layout (:class:`jaxmg_layout.BlockCyclic2D`) of a tall and,
for qr, a wide ``A``; the results, whole on every rank, are checked against numpy. qr with
``blocks``: each rank's ``Q`` and ``R`` as its local array of tiles where the grid divides them
(whole elsewhere), gathered and assembled by :class:`BlockCyclic2D`, against the whole results and
numpy, the padding zeros. Then the
version the engine read (cusolverMpGetVersion: the emulator models 0.8.0, without Gesvd), a
wide ``gels`` refused with the reason, and no misuse of the libraries.

Usage: ``mpiexec -n P python cusolvermp_rect_worker.py ROWSxCOLS TILE EMULATOR_DIR RESULTS_DIR``.
Each rank writes ``RESULTS_DIR/<rank>.jsonl``, one line per check.
"""

import ctypes
import json
import os
import pathlib
import sys

import numpy as np
from mpi4py import MPI

import jaxmg_cuda
from jaxmg_cuda import _jaxmg_cuda
from jaxmg_layout import BlockCyclic2D

grid_text, tile, emulator, results = sys.argv[1:5]
tile = int(tile)
rows, cols = (int(v) for v in grid_text.split("x"))
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
row, col = divmod(rank, cols)
jaxmg_cuda.mp.load()  # MPI and MKL's ScaLAPACK, which the emulator computes with
_jaxmg_cuda.set_cuda_library_dirs([emulator])
assert not _jaxmg_cuda.load_cuda_libraries(), "the emulator did not load"
nccl_id = comm.bcast(_jaxmg_cuda.nccl_unique_id() if rank == 0 else None, root=0)
nccl_words = np.frombuffer(nccl_id, np.int64).tolist()
lines = []


def check(name, ok, **details):
    lines.append(json.dumps({"check": name, "ok": bool(ok), **details}))


def random(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.issubdtype(dtype, np.complexfloating):
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def call(op, a, b=None, blocks=False, tile=tile):
    """``op`` on this rank's local array of ``a`` (column-major, one padding row past LLD)."""
    m, n = a.shape
    plan = BlockCyclic2D.make(m, n, (rows, cols), tile)
    block = plan.local_block(a, row, col)
    lld = block.shape[0] + 1
    local = np.zeros((max(1, block.shape[1]), lld), a.dtype)
    local[: block.shape[1], : block.shape[0]] = block.T
    return _jaxmg_cuda.run_rect_cuda_on_host(
        op=op,
        dtype=a.dtype.name,
        m=m,
        n=n,
        tile=tile,
        nrhs=0 if b is None else b.shape[1],
        grid=[rows, cols],
        position=rank,
        device_id=rank,  # a GPU of its own (NCCL refuses two ranks on one)
        local_cols=local.shape[0],
        lld=lld,
        a=local.tobytes(),
        b=b"" if b is None else np.ascontiguousarray(b).tobytes(),
        nccl_id=nccl_words,
        blocks=blocks,
    )


def assembled(data, dtype, shape):
    """A result of ``qr(..., blocks=True)``: whole where the grid does not divide ``shape``;
    else every rank's local array of tiles (``[Lc, Lr]``, column-major, each extent of the
    block rounded up to whole tiles), gathered and assembled, and whether the padding past each
    rank's own entries is zeros."""
    r, c = shape
    if r % rows or c % cols:
        return np.frombuffer(data, dtype).reshape(r, c), True
    plan = BlockCyclic2D.make(r, c, (rows, cols), tile)
    lr, lc = plan.padded_local_shape
    everyone = comm.allgather(np.frombuffer(data, dtype).reshape(lc, lr).T)
    parts, zeros = [], True
    for pr in range(rows):
        parts.append([])
        for pc in range(cols):
            local = everyone[pr * cols + pc]
            hr, hc = plan.local_shape(pr, pc)
            zeros &= not local[hr:].any() and not local[:, hc:].any()
            parts[-1].append(local[:hr, :hc])
    return plan.assemble(parts), zeros


def tolerance(dtype):
    return 1e-4 if np.finfo(dtype).bits <= 32 else 1e-12


for dtype in (np.float32, np.float64, np.complex64, np.complex128):
    name = np.dtype(dtype).name
    tol = tolerance(dtype)
    for m, n in ((11, 6), (6, 9)):
        A = random((m, n), dtype, seed=m * n)
        k = min(m, n)
        out = call("qr", A)
        q = np.frombuffer(out["out0"], dtype).reshape(m, k)
        r = np.frombuffer(out["out1"], dtype).reshape(k, n)
        backward = np.linalg.norm(q @ r - A) / np.linalg.norm(A)
        orthonormal = np.linalg.norm(q.conj().T @ q - np.eye(k))
        check(
            f"qr {m}x{n} {name}",
            not out["error"]
            and out["status"] == 0
            and backward < 10 * tol
            and orthonormal < 10 * tol
            and np.allclose(np.tril(r, -1), 0)
            and np.allclose(np.abs(np.diag(r)), np.abs(np.diag(np.linalg.qr(A)[1])), rtol=1e-3),
            backward=float(backward),
            orthonormal=float(orthonormal),
            error=out["error"],
        )
    for m, n in ((12, 8), (8, 12), (12, 5)):  # (12, 5): R, and on 1 x 2 Q, come back whole
        A = random((m, n), dtype, seed=m + n)
        k = min(m, n)
        whole = call("qr", A)
        out = call("qr", A, blocks=True)
        q, q_zeros = assembled(out["out0"], dtype, (m, k))
        r, r_zeros = assembled(out["out1"], dtype, (k, n))
        backward = np.linalg.norm(q @ r - A) / np.linalg.norm(A)
        check(
            f"qr in blocks {m}x{n} {name}",
            not out["error"]
            and out["status"] == 0
            and q_zeros
            and r_zeros
            and np.array_equal(q, np.frombuffer(whole["out0"], dtype).reshape(m, k))
            and np.array_equal(r, np.frombuffer(whole["out1"], dtype).reshape(k, n))
            and backward < 10 * tol
            and np.allclose(np.tril(r, -1), 0),
            backward=float(backward),
            error=out["error"],
        )
    A = random((13, 5), dtype, seed=5)
    b = random((13, 2), dtype, seed=6)
    out = call("gels", A, b)
    x = np.frombuffer(out["out0"], dtype).reshape(5, 2)
    expected = np.linalg.lstsq(A.astype(np.complex128), b.astype(np.complex128), rcond=None)[0]
    error = np.linalg.norm(x - expected) / np.linalg.norm(expected)
    check(
        f"gels 13x5 {name}",
        not out["error"] and out["status"] == 0 and error < 100 * tol,
        error=float(error),
        errors=out["error"],
    )

if rows * cols > 1:  # R's 2 rows per process row, or Q's 1 column per process column
    out = call("qr", random((8 * rows, 2 * cols), np.float64, seed=7), blocks=True, tile=3)
    check("qr in blocks, a tile wider than a block refused", "must be at most" in out["error"])

version, has_gesvd = _jaxmg_cuda.cusolvermp_version()
check("version read: 0.8.0, no Gesvd", version == 800 and not has_gesvd, version=version)

out = call("gels", random((4, 8), np.float64, seed=1), random((4, 1), np.float64, seed=2))
check("wide gels refused", "M >= N only" in out["error"], error=out["error"])

library = ctypes.CDLL(os.path.join(emulator, "libcudart.so.13"))
buffer = ctypes.create_string_buffer(1 << 16)
violations = library.fakecuda_violations(buffer, len(buffer))
check("no emulator violations", violations == 0, text=buffer.value.decode(errors="replace"))
pathlib.Path(results, f"{rank}.jsonl").write_text("\n".join(lines) + "\n")
