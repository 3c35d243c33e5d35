"""One rank of an ``mpiexec -n P`` job driving fakecuda's NCCL and cuSOLVERMp emulator
(``tests/native/fake_cuda/fake_cusolvermp.cc``) directly with ctypes, as jaxmg's cuSOLVERMp
engine will: device memory, streams and copies from the emulated CUDA runtime, a communicator
from ``ncclGetUniqueId`` shared by MPI, potrf + potrs, getrf + getrs and syevd on the 2D
block-cyclic layout of :class:`jaxmg_layout.BlockCyclic2D`, against numpy; ``ncclAllReduce``;
one call with a device workspace one byte short, which must be a violation; and at the end no
violation else and nothing left alive.

Usage: ``mpiexec -n P python fake_cusolvermp_worker.py LIBRARY RESULTS_DIR``. Each rank writes
``RESULTS_DIR/rank<r>.json``, a list of ``{"name", "ok", "detail"}`` checks.
"""

import ctypes
import json
import pathlib
import sys

import numpy as np
from mpi4py import MPI

import jaxmg_cuda
from jaxmg_layout import BlockCyclic2D

library, results = sys.argv[1], pathlib.Path(sys.argv[2])
world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
jaxmg_cuda.mp.load()  # MPICH, BLACS and ScaLAPACK, RTLD_GLOBAL: the emulator finds them there
lib = ctypes.CDLL(library)

P, I32, I64, U32, SZ = (
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.c_int64,
    ctypes.c_uint32,
    ctypes.c_size_t,
)
PP, PSZ = ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)
H2D, D2H = 1, 2
F64, F32 = 1, 0  # CUDA_R_64F, CUDA_R_32F
LOWER, OP_N = 0, 0
COL_MAJOR, ROW_MAJOR = 0, 1


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


WORK = [P, SZ, P, SZ, P]  # d_work, bytes, h_work, bytes, info
SIZES = [PSZ, PSZ]
SIGNATURES = {
    "cudaSetDevice": [I32],
    "cudaStreamCreate": [PP],
    "cudaStreamDestroy": [P],
    "cudaStreamSynchronize": [P],
    "cudaMalloc": [PP, SZ],
    "cudaFree": [P],
    "cudaMemcpyAsync": [P, P, SZ, I32, P],
    "fakecuda_violations": [ctypes.c_char_p, I32],
    "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
    "ncclCommInitRank": [PP, I32, UniqueId, I32],
    "ncclCommDestroy": [P],
    "ncclAllReduce": [P, P, SZ, I32, I32, P, P],
    "cusolverMpCreate": [PP, I32, P],
    "cusolverMpDestroy": [P],
    "cusolverMpSetStream": [P, P],
    "cusolverMpCreateDeviceGrid": [P, PP, P, I32, I32, I32],
    "cusolverMpDestroyGrid": [P],
    "cusolverMpCreateMatrixDesc": [PP, P, I32, I64, I64, I64, I64, U32, U32, I64],
    "cusolverMpDestroyMatrixDesc": [P],
    "cusolverMpPotrf_bufferSize": [P, I32, I64, P, I64, I64, P, I32] + SIZES,
    "cusolverMpPotrf": [P, I32, I64, P, I64, I64, P, I32] + WORK,
    "cusolverMpPotrs_bufferSize": [P, I32, I64, I64, P, I64, I64, P, P, I64, I64, P, I32] + SIZES,
    "cusolverMpPotrs": [P, I32, I64, I64, P, I64, I64, P, P, I64, I64, P, I32] + WORK,
    "cusolverMpGetrf_bufferSize": [P, I64, I64, P, I64, I64, P, P, I32] + SIZES,
    "cusolverMpGetrf": [P, I64, I64, P, I64, I64, P, P, I32] + WORK,
    "cusolverMpGetrs_bufferSize": [P, I32, I64, I64, P, I64, I64, P, P, P, I64, I64, P, I32]
    + SIZES,
    "cusolverMpGetrs": [P, I32, I64, I64, P, I64, I64, P, P, P, I64, I64, P, I32] + WORK,
    "cusolverMpSyevd_bufferSize": [P, P, I32, I64, P, I64, I64, P, P, P, I64, I64, P, I32] + SIZES,
    "cusolverMpSyevd": [P, P, I32, I64, P, I64, I64, P, P, P, I64, I64, P, I32] + WORK,
    "cusolverMpGetVersion": [P, ctypes.POINTER(I32)],
    "cusolverMpGeqrf_bufferSize": [P, I64, I64, P, I64, I64, P, I32] + SIZES,
    "cusolverMpGeqrf": [P, I64, I64, P, I64, I64, P, P, I32] + WORK,
    "cusolverMpOrgqr_bufferSize": [P, I64, I64, I64, P, I64, I64, P, P, I32] + SIZES,
    "cusolverMpOrgqr": [P, I64, I64, I64, P, I64, I64, P, P, I32] + WORK,
    "cusolverMpGels_bufferSize": [P, I32, I64, I64, I64, P, I64, I64, P, P, I64, I64, P, I32]
    + SIZES,
    "cusolverMpGels": [P, I32, I64, I64, I64, P, I64, I64, P, P, I64, I64, P, I32] + WORK,
}
for name, argtypes in SIGNATURES.items():
    getattr(lib, name).argtypes = argtypes
    getattr(lib, name).restype = I32
lib.cusolverMpNUMROC.argtypes = [I64, I64, U32, U32, U32]
lib.cusolverMpNUMROC.restype = I64
lib.ncclGetErrorString.restype = ctypes.c_char_p
for name in ("handles", "grids", "descriptors", "comms"):
    getattr(lib, f"fakecuda_mp_live_{name}").restype = ctypes.c_long
for name in ("fakecuda_mp_calls", "fakecuda_live_allocations", "fakecuda_queued_ops"):
    getattr(lib, name).restype = ctypes.c_long
lib.fakecuda_mp_calls_of.argtypes = [ctypes.c_char_p]
lib.fakecuda_mp_calls_of.restype = ctypes.c_long

checks = []


def check(name, ok, detail=""):
    checks.append({"name": name, "ok": bool(ok), "detail": str(detail)})
    return bool(ok)


def ok(status, what):
    if status != 0:
        raise RuntimeError(f"rank {rank}: {what} returned {status}: {violations()[1]}")


def violations():
    buf = ctypes.create_string_buffer(1 << 16)
    return lib.fakecuda_violations(buf, len(buf)), buf.value.decode()


def out_ptr():
    return ctypes.c_void_p()


def malloc(nbytes):
    p = out_ptr()
    ok(lib.cudaMalloc(ctypes.byref(p), max(int(nbytes), 1)), "cudaMalloc")
    allocations.append(p)
    return p


def upload(array, stream):
    """A device copy of a host array, queued on the stream (ordered before the routines)."""
    array = np.ascontiguousarray(array) if array.ndim < 2 else array
    p = malloc(array.nbytes)
    if array.nbytes:
        ok(lib.cudaMemcpyAsync(p, array.ctypes.data, array.nbytes, H2D, stream), "H2D")
    keep.append(array)
    return p


def download(p, nbytes, dtype, stream):
    """The device bytes, copied back after a synchronisation of the stream."""
    out = np.empty(max(nbytes, 1), np.uint8)
    if nbytes:
        ok(lib.cudaMemcpyAsync(out.ctypes.data, p, nbytes, D2H, stream), "D2H")
    ok(lib.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    return out[:nbytes].view(dtype)


allocations, keep = [], []

# --- communicator and handle ------------------------------------------------------------------
ok(lib.cudaSetDevice(rank), "cudaSetDevice")  # one device per process, as NCCL requires
stream = out_ptr()
ok(lib.cudaStreamCreate(ctypes.byref(stream)), "cudaStreamCreate")
uid = UniqueId()
if rank == 0:
    ok(lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
uid = UniqueId.from_buffer_copy(world.bcast(bytes(uid), root=0))
comm = out_ptr()
ok(lib.ncclCommInitRank(ctypes.byref(comm), size, uid, rank), "ncclCommInitRank")
handle = out_ptr()
ok(lib.cusolverMpCreate(ctypes.byref(handle), rank, stream), "cusolverMpCreate")
ok(lib.cusolverMpSetStream(handle, stream), "cusolverMpSetStream")
version = I32()
ok(lib.cusolverMpGetVersion(handle, ctypes.byref(version)), "cusolverMpGetVersion")
check("version: 0.8.0's (no Gesvd)", version.value == 800, version.value)


class Matrix:
    """A global matrix on the grid: this process's local array on the device (LLD padded by
    one row, to see LLD passed through), and its descriptor."""

    def __init__(self, grid, me, global_matrix, tile, dtype=np.float64):
        rows, cols = grid.shape
        self.plan = BlockCyclic2D.make(*global_matrix.shape, (rows, cols), tile)
        self.me, self.dtype = me, dtype
        local = self.plan.local_block(global_matrix.astype(dtype), *me)
        self.shape = local.shape
        self.lld = local.shape[0] + 1
        check(
            "numroc",
            lib.cusolverMpNUMROC(global_matrix.shape[0], tile, me[0], 0, rows) == local.shape[0]
            and lib.cusolverMpNUMROC(global_matrix.shape[1], tile, me[1], 0, cols)
            == local.shape[1],
        )
        padded = np.zeros((self.lld, local.shape[1]), dtype, order="F")
        padded[: local.shape[0]] = local
        self.nbytes = padded.nbytes
        self.ptr = upload(padded.reshape(-1, order="F"), stream)
        self.desc = out_ptr()
        kind = F64 if dtype == np.float64 else F32
        ok(
            lib.cusolverMpCreateMatrixDesc(
                ctypes.byref(self.desc), grid.ptr, kind, *global_matrix.shape, tile, tile, 0, 0,
                self.lld,
            ),
            "cusolverMpCreateMatrixDesc",
        )  # fmt: skip

    def gathered(self):
        """The global matrix, from every process's local array."""
        flat = download(self.ptr, self.nbytes, self.dtype, stream)
        local = flat.reshape((self.lld, self.shape[1]), order="F")[: self.shape[0]]
        blocks = world.allgather((self.me, np.array(local)))
        grid = [[None] * self.plan.cols for _ in range(self.plan.rows)]
        for (pr, pc), block in blocks:
            grid[pr][pc] = block
        return self.plan.assemble(grid)

    def destroy(self):
        ok(lib.cusolverMpDestroyMatrixDesc(self.desc), "cusolverMpDestroyMatrixDesc")


class Grid:
    def __init__(self, rows, cols, mapping):
        self.shape = (rows, cols)
        self.ptr = out_ptr()
        ok(
            lib.cusolverMpCreateDeviceGrid(
                handle, ctypes.byref(self.ptr), comm, rows, cols, mapping
            ),
            "cusolverMpCreateDeviceGrid",
        )
        # Where cuSOLVERMp puts this rank (NVIDIA's samples).
        self.me = (
            (rank % rows, rank // rows) if mapping == COL_MAJOR else (rank // cols, rank % cols)
        )


def workspace(fn, *args):
    d_bytes, h_bytes = SZ(), SZ()
    ok(fn(*args, ctypes.byref(d_bytes), ctypes.byref(h_bytes)), fn.__name__)
    check(f"{fn.__name__} > 0", d_bytes.value > 0 and h_bytes.value > 0, (d_bytes, h_bytes))
    host = ctypes.create_string_buffer(h_bytes.value)
    keep.append(host)
    return malloc(d_bytes.value), d_bytes.value, host, h_bytes.value


def info_of(p):
    return int(download(p, 4, np.int32, stream)[0])


def run_grid(rows, cols, mapping, n=7, tile=2):
    grid = Grid(rows, cols, mapping)
    tag = f"{rows}x{cols}{'C' if mapping == COL_MAJOR else 'R'}"
    rng = np.random.default_rng(7)
    m = rng.standard_normal((n, n))
    spd = m @ m.T / n + np.eye(n)
    rhs = rng.standard_normal((n, 1))
    # Zeroed once, as NVIDIA's samples do: a routine that succeeds leaves it (the emulator's [G]).
    info = upload(np.zeros(1, np.int32), stream)

    # potrf + potrs
    a, b = Matrix(grid, grid.me, spd, tile), Matrix(grid, grid.me, rhs, tile)
    args = (handle, LOWER, n, a.ptr, 1, 1, a.desc, F64)
    work = workspace(lib.cusolverMpPotrf_bufferSize, *args)
    ok(lib.cusolverMpPotrf(*args, *work, info), "cusolverMpPotrf")
    check(f"{tag} potrf info", info_of(info) == 0)
    args = (handle, LOWER, n, 1, a.ptr, 1, 1, a.desc, b.ptr, 1, 1, b.desc, F64)
    work = workspace(lib.cusolverMpPotrs_bufferSize, *args)
    ok(lib.cusolverMpPotrs(*args, *work, info), "cusolverMpPotrs")
    check(f"{tag} potrs info", info_of(info) == 0)
    factor = np.tril(a.gathered())
    check(f"{tag} potrf L", np.allclose(factor @ factor.T, spd), factor)
    x = b.gathered()
    check(f"{tag} potrs x", np.allclose(x, np.linalg.solve(spd, rhs)), x.ravel())
    a.destroy(), b.destroy()

    # getrf + getrs
    general = m + n * np.diag(rng.permutation(n) - n / 2)  # pivoting happens
    a, b = Matrix(grid, grid.me, general, tile), Matrix(grid, grid.me, rhs, tile)
    ipiv = malloc(8 * a.shape[1])
    args = (handle, n, n, a.ptr, 1, 1, a.desc, ipiv, F64)
    work = workspace(lib.cusolverMpGetrf_bufferSize, *args)
    ok(lib.cusolverMpGetrf(*args, *work, info), "cusolverMpGetrf")
    check(f"{tag} getrf info", info_of(info) == 0)
    args = (handle, OP_N, n, 1, a.ptr, 1, 1, a.desc, ipiv, b.ptr, 1, 1, b.desc, F64)
    work = workspace(lib.cusolverMpGetrs_bufferSize, *args)
    ok(lib.cusolverMpGetrs(*args, *work, info), "cusolverMpGetrs")
    check(f"{tag} getrs info", info_of(info) == 0)
    x = b.gathered()
    check(f"{tag} getrs x", np.allclose(x, np.linalg.solve(general, rhs)), x.ravel())
    pivots = download(ipiv, 8 * a.shape[1], np.int64, stream)
    cols_here = a.plan.col_map(grid.me[1])
    check(f"{tag} getrf pivots in range", np.all((pivots >= cols_here + 1) & (pivots <= n)), pivots)
    a.destroy(), b.destroy()

    # syevd
    a, q = Matrix(grid, grid.me, spd, tile), Matrix(grid, grid.me, np.zeros((n, n)), tile)
    d = malloc(8 * n)
    jobz = ctypes.create_string_buffer(b"V")
    args = (handle, jobz, LOWER, n, a.ptr, 1, 1, a.desc, d, q.ptr, 1, 1, q.desc, F64)
    work = workspace(lib.cusolverMpSyevd_bufferSize, *args)
    ok(lib.cusolverMpSyevd(*args, *work, info), "cusolverMpSyevd")
    check(f"{tag} syevd info", info_of(info) == 0)
    w = download(d, 8 * n, np.float64, stream)
    check(f"{tag} syevd w", np.allclose(w, np.linalg.eigvalsh(spd)), w)
    v = q.gathered()
    check(f"{tag} syevd vectors", np.allclose(spd @ v, v * w) and np.allclose(v.T @ v, np.eye(n)))
    a.destroy(), q.destroy()

    # geqrf + orgqr: Q R of a tall matrix, R upper triangular, Q orthonormal (as numpy's, up
    # to the signs of R's diagonal)
    rows = n + 3
    tall = rng.standard_normal((rows, n))
    a = Matrix(grid, grid.me, tall, tile)
    tau = malloc(8 * max(a.shape[1], 1))
    args = (handle, rows, n, a.ptr, 1, 1, a.desc, F64)
    work = workspace(lib.cusolverMpGeqrf_bufferSize, *args)
    ok(lib.cusolverMpGeqrf(*args[:-1], tau, F64, *work, info), "cusolverMpGeqrf")
    check(f"{tag} geqrf info", info_of(info) == 0)
    r = np.triu(a.gathered()[:n])
    args = (handle, rows, n, n, a.ptr, 1, 1, a.desc, tau, F64)
    work = workspace(lib.cusolverMpOrgqr_bufferSize, *args)
    ok(lib.cusolverMpOrgqr(*args, *work, info), "cusolverMpOrgqr")
    check(f"{tag} orgqr info", info_of(info) == 0)
    q = a.gathered()
    check(f"{tag} geqrf+orgqr Q R = A", np.allclose(q @ r, tall), q @ r - tall)
    check(f"{tag} orgqr Q orthonormal", np.allclose(q.T @ q, np.eye(n)))
    check(f"{tag} geqrf R as numpy's", np.allclose(np.abs(r), np.abs(np.linalg.qr(tall)[1])))
    a.destroy()

    # gels: the least-squares solution of a tall full-rank system, in B's first n rows
    a, b = (
        Matrix(grid, grid.me, tall, tile),
        Matrix(grid, grid.me, rng.standard_normal((rows, 1)), tile),
    )
    rhs_tall = b.gathered()
    args = (handle, OP_N, rows, n, 1, a.ptr, 1, 1, a.desc, b.ptr, 1, 1, b.desc, F64)
    work = workspace(lib.cusolverMpGels_bufferSize, *args)
    ok(lib.cusolverMpGels(*args, *work, info), "cusolverMpGels")
    check(f"{tag} gels info", info_of(info) == 0)
    x = b.gathered()[:n]
    expected = np.linalg.lstsq(tall, rhs_tall, rcond=None)[0]
    check(f"{tag} gels x", np.allclose(x, expected), x.ravel() - expected.ravel())
    a.destroy(), b.destroy()
    ok(lib.cusolverMpDestroyGrid(grid.ptr), "cusolverMpDestroyGrid")


grids = [(1, size, COL_MAJOR), (1, size, ROW_MAJOR)]
if size == 4:
    grids += [(2, 2, COL_MAJOR), (2, 2, ROW_MAJOR)]
for shape in grids:
    run_grid(*shape)
for name in ("Potrf", "Potrs", "Getrf", "Getrs", "Syevd", "Geqrf", "Orgqr", "Gels"):
    calls = lib.fakecuda_mp_calls_of(f"cusolverMp{name}".encode())
    check(f"{name} calls", calls == len(grids), calls)

# ncclAllReduce, in place and not, float64 and float32.
for dtype, kind in ((np.float64, 8), (np.float32, 7)):
    mine = (rank + 1) * np.arange(1, 6, dtype=dtype)
    expected = size * (size + 1) / 2 * np.arange(1, 6, dtype=dtype)
    send = upload(mine, stream)
    recv = malloc(mine.nbytes)
    ok(lib.ncclAllReduce(send, recv, 5, kind, 0, comm, stream), "ncclAllReduce")
    ok(lib.ncclAllReduce(send, send, 5, kind, 0, comm, stream), "ncclAllReduce in place")
    for p, what in ((recv, "out of place"), (send, "in place")):
        got = download(p, mine.nbytes, dtype, stream)
        check(f"allreduce {dtype.__name__} {what}", np.allclose(got, expected), got)
check("allreduce calls", lib.fakecuda_mp_calls_of(b"ncclAllReduce") == 4)
count, text = violations()
check("no violation", count == 0, text)

# A device workspace one byte short of the _bufferSize answer: a violation on every rank.
grid = Grid(1, size, COL_MAJOR)
a = Matrix(grid, grid.me, np.eye(4), 2)
info = malloc(4)
args = (handle, LOWER, 4, a.ptr, 1, 1, a.desc, F64)
d_work, d_bytes, h_work, h_bytes = workspace(lib.cusolverMpPotrf_bufferSize, *args)
status = lib.cusolverMpPotrf(*args, d_work, d_bytes - 1, h_work, h_bytes, info)
count, text = violations()
check("short workspace refused", status != 0 and count == 1, (status, count))
check("short workspace named", "workspaceInBytesOnDevice" in text, text)
a.destroy()
ok(lib.cusolverMpDestroyGrid(grid.ptr), "cusolverMpDestroyGrid")

# --- teardown: nothing left alive ------------------------------------------------------------
ok(lib.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
for p in allocations:
    ok(lib.cudaFree(p), "cudaFree")
ok(lib.cusolverMpDestroy(handle), "cusolverMpDestroy")
ok(lib.ncclCommDestroy(comm), "ncclCommDestroy")
ok(lib.cudaStreamDestroy(stream), "cudaStreamDestroy")
live = {
    name: getattr(lib, f"fakecuda_mp_live_{name}")()
    for name in ("handles", "grids", "descriptors", "comms")
}
live["allocations"] = lib.fakecuda_live_allocations()
live["queued"] = lib.fakecuda_queued_ops()
check("nothing alive", not any(live.values()), live)
check("one violation in all", violations()[0] == 1, violations()[1])
(results / f"rank{rank}.json").write_text(json.dumps(checks))
