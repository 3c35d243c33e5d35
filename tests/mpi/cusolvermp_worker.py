"""One rank of an ``mpiexec -n P`` job running backend "mp"'s GPU engine
(csrc/engines/cusolvermp.cc) outside XLA, through the test hook ``run_cuda_on_host`` with a grid,
against the emulator of the CUDA runtime, NCCL and cuSOLVERMp in ``tests/native/fake_cuda`` (numbers
from MKL's ScaLAPACK, loaded here by ``jaxmg_cuda.mp.load``). Each rank stages its local array of
the 2D block-cyclic layout (:class:`jaxmg_layout.BlockCyclic2D`) on its emulated GPU; the engine
builds the NCCL communicator from the unique id rank 0 made, the handle, the grid and the
descriptors, runs the routine and writes the outputs back. The results are checked against numpy.

Usage: ``mpiexec -n P python cusolvermp_worker.py ROWSxCOLS TILE N EMULATOR_DIR RESULTS_DIR``.
Each rank writes ``RESULTS_DIR/<rank>.jsonl``: one line per check, then the emulator's state.
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

grid_text, tile, n, emulator, results = sys.argv[1:6]
tile, n = int(tile), int(n)
rows, cols = (int(v) for v in grid_text.split("x"))
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
row, col = divmod(rank, cols)
jaxmg_cuda.mp.load()  # MPI and MKL's ScaLAPACK, which the emulator computes with
_jaxmg_cuda.set_cuda_library_dirs([emulator])
assert not _jaxmg_cuda.load_cuda_libraries(), "the emulator did not load"
nccl_id = comm.bcast(_jaxmg_cuda.nccl_unique_id() if rank == 0 else None, root=0)
nccl_words = np.frombuffer(nccl_id, np.int64).tolist()
plan = BlockCyclic2D.make(n, n, (rows, cols), tile)
local_rows, local_cols = plan.local_shape(row, col)
lld = max(1, local_rows)
lines = []


def check(name, ok, **details):
    lines.append(json.dumps({"check": name, "ok": bool(ok), **details}))


def hermitian_pd(dtype, seed):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    if np.issubdtype(dtype, np.complexfloating):
        m = m + 1j * rng.standard_normal((n, n))
    return (m @ m.conj().T + n * np.eye(n)).astype(dtype)


def local(matrix):
    """This rank's column-major local array as row-major [C, LLD] bytes."""
    out = np.zeros((max(1, local_cols), lld), matrix.dtype)
    block = plan.local_block(matrix, row, col)
    out[: block.shape[1], : block.shape[0]] = block.T
    return out


def assembled(local_bytes, dtype):
    """The global matrix from every rank's [C, LLD] local array."""
    mine = np.frombuffer(local_bytes, dtype).reshape(max(1, local_cols), lld)
    every = comm.allgather(mine)
    blocks = [[None] * cols for _ in range(rows)]
    for p, array in enumerate(every):
        i, j = divmod(p, cols)
        r, c = plan.local_shape(i, j)
        blocks[i][j] = array[:c, :r].T
    return plan.assemble(blocks)


def call(op, dtype, a, *, b=None, ipiv=None, trans="N"):
    a_local = local(a)
    kwargs = dict(
        op=op,
        dtype=np.dtype(dtype).name,
        n=n,
        local=a_local.shape[0],
        nrhs=0 if b is None else b.shape[1],
        tile=tile,
        vectors=True,
        aliased=True,
        device_ids=[rank],  # a GPU of its own (NCCL refuses two ranks on one)
        positions=[rank],
        a=[a_local.tobytes()],
        b=[] if b is None else [np.ascontiguousarray(b.T).tobytes()],
        call_id=0,
        job=0,
        pids=[],
        ipiv=[] if ipiv is None else [ipiv],
        trans=trans,
        grid=[rows, cols],
        lld=lld,
        ipiv_len=max(lld, a_local.shape[0]) + tile,  # jaxmg_cuda.mp.getrf's on GPUs
        nccl_id=nccl_words,
    )
    out = _jaxmg_cuda.run_cuda_on_host(**kwargs)
    return out


def tolerance(dtype):
    return 1e-3 if np.finfo(dtype).bits <= 32 else 1e-10


for dtype in (np.float32, np.float64, np.complex64, np.complex128):
    name = np.dtype(dtype).name
    tol = tolerance(dtype)
    A = hermitian_pd(dtype, seed=7)
    b = np.random.default_rng(3).standard_normal((n, 2)).astype(dtype)
    scale = np.linalg.norm(A.astype(np.complex128)) * np.linalg.norm(b.astype(np.complex128))

    out = call("potrs", dtype, A, b=b)
    x = np.frombuffer(out["x"][0], dtype).reshape(2, n).T
    factor = np.tril(assembled(out["a"][0], dtype))
    residual = np.linalg.norm(A @ x - b) / scale
    check(
        f"potrs {name}",
        not out["errors"][0] and out["status"] == [0] and residual < tol,
        residual=float(residual),
        errors=out["errors"],
    )
    check(
        f"potrs factor {name}",
        np.allclose(factor @ factor.conj().T, A, rtol=tol, atol=tol * np.abs(A).max()),
    )

    out = call("potrf", dtype, A)
    lower = np.tril(assembled(out["a"][0], dtype))
    solved = call("potrs_factored", dtype, lower, b=b)
    x = np.frombuffer(solved["x"][0], dtype).reshape(2, n).T
    residual = np.linalg.norm(A @ x - b) / scale
    check(
        f"potrf + potrs_factored {name}",
        out["status"] == [0] and solved["status"] == [0] and residual < tol,
        residual=float(residual),
        errors=out["errors"] + solved["errors"],
    )

    G = (A + np.triu(A, 1) * 0.5).astype(dtype)  # not Hermitian: LU pivots
    lu = call("getrf", dtype, G)
    factors = assembled(lu["a"][0], dtype)
    solved = call("getrs", dtype, factors, b=b, ipiv=lu["ipiv"][0])
    x = np.frombuffer(solved["x"][0], dtype).reshape(2, n).T
    residual = np.linalg.norm(G @ x - b) / (np.linalg.norm(G) * np.linalg.norm(b))
    check(
        f"getrf + getrs {name}",
        lu["status"] == [0] and solved["status"] == [0] and residual < tol,
        residual=float(residual),
        errors=lu["errors"] + solved["errors"],
    )

    out = call("syevd", dtype, A)
    w = np.frombuffer(out["w"][0], np.finfo(dtype).dtype)
    v = assembled(out["a"][0], dtype)
    expected = np.linalg.eigvalsh(A.astype(np.complex128))
    worst = np.abs(A @ v - v * w).max() / np.abs(A).max()
    check(
        f"syevd {name}",
        out["status"] == [0]
        and np.allclose(w, expected, rtol=tol, atol=tol * np.abs(expected).max())
        and worst < 10 * tol,
        vectors=float(worst),
        errors=out["errors"],
    )

# Not positive definite: cuSOLVERMp 0.8.0's Potrf fails with an internal error instead of an
# info (the emulator's [G]); the engine says what that means, on every process.
A = hermitian_pd(np.float64, seed=9)
A[n // 2, n // 2] = -1.0
out = call("potrs", np.float64, A, b=np.ones((n, 1)))
check(
    "potrs not positive definite: said so",
    "CUSOLVER_STATUS_INTERNAL_ERROR" in out["errors"][0]
    and "not positive definite" in out["errors"][0],
    errors=out["errors"],
)

# An exactly singular U: the status is LAPACK's, the first k with U(k, k) == 0 (cuSOLVERMp's own
# info says only that there is one; the emulator gives the index within its tile).
for j in sorted({n // 2 + 1, n - 1}):
    S = np.eye(n)
    S[:, j] = 0.0  # no pivoting: U = S, U(j + 1, j + 1) (1-based) is the first zero
    lu = call("getrf", np.float64, S)
    check(f"getrf singular at {j + 1}", lu["status"] == [j + 1], status=lu["status"])

# What cuSOLVERMp 0.9 cannot do is refused with the reason, on every process.
out = call("potri", np.float64, hermitian_pd(np.float64, seed=1))
check("potri refused", "has no inverse" in out["errors"][0], errors=out["errors"])
G = hermitian_pd(np.float64, seed=2)
lu = call("getrf", np.float64, G)
out = call(
    "getrs",
    np.float64,
    assembled(lu["a"][0], np.float64),
    b=np.ones((n, 1)),
    ipiv=lu["ipiv"][0],
    trans="T",
)
check("getrs trans T refused", "trans 'N'" in out["errors"][0], errors=out["errors"])

library = ctypes.CDLL(os.path.join(emulator, "libcudart.so.13"))
buffer = ctypes.create_string_buffer(1 << 16)
violations = library.fakecuda_violations(buffer, len(buffer))
check("no emulator violations", violations == 0, text=buffer.value.decode(errors="replace"))
pathlib.Path(results, f"{rank}.jsonl").write_text("\n".join(lines) + "\n")
