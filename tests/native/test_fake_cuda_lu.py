"""The CUDA emulator's LU routines (cusolverMgGetrf / Getrs and their bufferSize calls),
driven directly through ctypes, checked against scipy and numpy.

jaxmg's own CUDA path is tested on the emulator by ``test_cuda_host_calls.py``; this file proves
the emulator itself right for LU, so that a failure there is jaxmg's and not the emulator's:

- getrf overwrites A with P L U (L unit lower, U upper) in the 1-D column block-cyclic layout
  of its descriptor, writes LAPACK's 1-based pivots distributed like A's columns (device p's
  IPIV holds the pivots of its local columns), and reports info = k for an exactly zero U(k, k);
- getrs solves A X = B (CUBLAS_OP_N) from that factor;
- what cuSolverMg refused on an H100 is refused alike, and is no violation: getrs with
  CUBLAS_OP_T or _C answers info = -1 (its bufferSize takes them), getrf with a column tile of
  1024 or more answers info = -6; syevd with a tile over 1024 (refused in a way not recorded)
  is a violation;
- misuse is a violation: IPIV on the wrong device or too small, a workspace below the
  bufferSize answer, getrs on pivots getrf did not write.

The library is loaded in this process under a soname of its own (nothing else here opens it).
"""

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg

HERE = Path(__file__).parent / "fake_cuda"
TYPES = {  # cudaDataType
    np.dtype(np.float32): 0,
    np.dtype(np.float64): 1,
    np.dtype(np.complex64): 4,
    np.dtype(np.complex128): 5,
}
H2D, D2H = 1, 2
OP_N, OP_T, OP_C = 0, 1, 2

P = ctypes.c_void_p
PP = ctypes.POINTER(ctypes.c_void_p)
INT = ctypes.c_int
I64 = ctypes.c_int64
PI = ctypes.POINTER(ctypes.c_int)
PI64 = ctypes.POINTER(ctypes.c_int64)
SIGNATURES = {
    "cudaSetDevice": [INT],
    "cudaMalloc": [PP, ctypes.c_size_t],
    "cudaFree": [P],
    "cudaMemcpy": [P, P, ctypes.c_size_t, INT],
    "cudaDeviceSynchronize": [],
    "cusolverMgCreate": [PP],
    "cusolverMgDestroy": [P],
    "cusolverMgDeviceSelect": [P, INT, PI],
    "cusolverMgCreateDeviceGrid": [PP, ctypes.c_int32, ctypes.c_int32, PI, INT],
    "cusolverMgDestroyGrid": [P],
    "cusolverMgCreateMatrixDesc": [PP, I64, I64, I64, I64, INT, P],
    "cusolverMgDestroyMatrixDesc": [P],
    "cusolverMgGetrf_bufferSize": [P, INT, INT, PP, INT, INT, P, PP, INT, PI64],
    "cusolverMgGetrf": [P, INT, INT, PP, INT, INT, P, PP, INT, PP, I64, PI],
    "cusolverMgGetrs_bufferSize": [
        P,
        INT,
        INT,
        INT,
        PP,
        INT,
        INT,
        P,
        PP,
        PP,
        INT,
        INT,
        P,
        INT,
        PI64,
    ],
    "cusolverMgGetrs": [P, INT, INT, INT, PP, INT, INT, P, PP, PP, INT, INT, P, INT, PP, I64, PI],
    "cusolverMgSyevd_bufferSize": [P, INT, INT, INT, PP, INT, INT, P, P, INT, INT, PI64],
    "fakecuda_violations": [ctypes.c_char_p, INT],
    "fakecuda_live_allocations": [],
}


@pytest.fixture(scope="module")
def lib(tmp_path_factory, once_per_suite):
    """The emulator, compiled for this run and loaded here."""
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the CUDA emulator")
    library = tmp_path_factory.mktemp("fake_cuda_lu") / "libfakecuda_lu.so"
    subprocess.run(
        [compiler, "-std=c++17", "-O1", "-g", "-shared", "-fPIC", "-Wl,-soname,libfakecuda_lu.so"]
        + ["-I", str(HERE.parents[2] / "packages" / "jaxmg-cuda" / "csrc")]
        + ["-o", str(library), str(HERE / "fake_cuda.cc"), str(HERE / "fake_cusolvermp.cc")]
        + ["-lpthread", "-ldl"],
        check=True,
        timeout=300,
    )
    lib = ctypes.CDLL(str(library))
    for name, argtypes in SIGNATURES.items():
        getattr(lib, name).argtypes = argtypes
        getattr(lib, name).restype = INT
    lib.fakecuda_live_allocations.restype = ctypes.c_long
    return lib


def violations(lib):
    buf = ctypes.create_string_buffer(1 << 16)
    count = lib.fakecuda_violations(buf, len(buf))
    return count, buf.value.decode()


def ptrs(values):
    return (ctypes.c_void_p * len(values))(*values)


class Mg:
    """A handle, a 1 x G grid on ``ids`` and the allocations of one test, freed by close()."""

    def __init__(self, lib, ids):
        self.lib, self.ids, self.allocs, self.descs = lib, list(ids), [], []
        self.handle, self.grid = P(), P()
        assert lib.cusolverMgCreate(ctypes.byref(self.handle)) == 0
        devices = (ctypes.c_int * len(ids))(*ids)
        assert lib.cusolverMgDeviceSelect(self.handle, len(ids), devices) == 0
        assert lib.cusolverMgCreateDeviceGrid(ctypes.byref(self.grid), 1, len(ids), devices, 0) == 0

    def desc(self, rows, cols, tile, dtype):
        d = P()
        status = self.lib.cusolverMgCreateMatrixDesc(
            ctypes.byref(d), rows, cols, rows, tile, TYPES[np.dtype(dtype)], self.grid
        )
        assert status == 0
        self.descs.append(d)
        return d

    def malloc(self, device, nbytes):
        assert self.lib.cudaSetDevice(device) == 0
        p = P()
        assert self.lib.cudaMalloc(ctypes.byref(p), max(nbytes, 1)) == 0
        self.allocs.append(p.value)
        return p.value

    def upload(self, device, array):
        array = np.ascontiguousarray(array)
        p = self.malloc(device, array.nbytes)
        if array.nbytes:
            assert self.lib.cudaMemcpy(p, array.ctypes.data, array.nbytes, H2D) == 0
        return p

    def download(self, p, shape, dtype):
        out = np.empty(shape, dtype)
        if out.nbytes:
            assert self.lib.cudaMemcpy(out.ctypes.data, p, out.nbytes, D2H) == 0
        return out

    def sync(self):
        for d in self.ids:
            assert self.lib.cudaSetDevice(d) == 0
            assert self.lib.cudaDeviceSynchronize() == 0

    def close(self):
        self.sync()
        for p in self.allocs:
            assert self.lib.cudaFree(p) == 0
        for d in self.descs:
            assert self.lib.cusolverMgDestroyMatrixDesc(d) == 0
        assert self.lib.cusolverMgDestroyGrid(self.grid) == 0
        assert self.lib.cusolverMgDestroy(self.handle) == 0


def local_columns(n, tile, ndev, p):
    """The global columns grid position p holds, in its local order (1-D block-cyclic)."""
    return [j for j in range(n) if (j // tile) % ndev == p]


class Lu:
    """A on the grid (each position exactly its local columns), IPIV likewise, one getrf."""

    def __init__(self, mg, A, tile, ipiv_extra=0):
        self.mg, self.A, self.tile = mg, A, tile
        self.n, self.g, self.dtype = A.shape[0], len(mg.ids), A.dtype
        self.cols = [local_columns(self.n, tile, self.g, p) for p in range(self.g)]
        self.desc = mg.desc(self.n, self.n, tile, A.dtype)
        pairs = list(zip(mg.ids, self.cols, strict=True))
        # Column-major n x L_p: the rows of A[:, cols].T
        self.a = ptrs([mg.upload(d, A[:, c].T) for d, c in pairs])
        self.ipiv = ptrs([mg.malloc(d, 4 * (len(c) + ipiv_extra)) for d, c in pairs])
        self.type = TYPES[self.dtype]

    def workspace(self, lwork):
        size = np.dtype(self.dtype).itemsize * lwork
        return ptrs([self.mg.malloc(d, size) for d in self.mg.ids])

    def getrf_args(self):
        n = self.n
        return (self.mg.handle, n, n, self.a, 1, 1, self.desc, self.ipiv, self.type)

    def getrf_size(self):
        lwork = ctypes.c_int64(-1)
        status = self.mg.lib.cusolverMgGetrf_bufferSize(*self.getrf_args(), ctypes.byref(lwork))
        return status, lwork.value

    def getrf(self, lwork_delta=0):
        status, lwork = self.getrf_size()
        assert status == 0 and lwork > 0
        info = ctypes.c_int(-99)
        work = self.workspace(lwork)
        status = self.mg.lib.cusolverMgGetrf(
            *self.getrf_args(), work, lwork + lwork_delta, ctypes.byref(info)
        )
        return status, info.value

    def result(self):
        """The factor and the 1-based pivots, gathered to global arrays."""
        self.mg.sync()
        lu = np.empty((self.n, self.n), self.dtype)
        piv = np.empty(self.n, np.int32)
        for p, c in enumerate(self.cols):
            lu[:, c] = self.mg.download(self.a[p], (len(c), self.n), self.dtype).T
            piv[c] = self.mg.download(self.ipiv[p], len(c), np.int32)
        return lu, piv

    def getrs(self, trans, b):
        """Solves op(A) X = b (b: N x NRHS) with B on the grid's first device."""
        mg, lib, n, nrhs = self.mg, self.mg.lib, self.n, b.shape[1]
        mg.sync()
        desc_b = mg.desc(n, nrhs, nrhs, self.dtype)
        # B[0] holds all of B; the other positions own no column, any memory of theirs will do.
        b_ptrs = ptrs([mg.upload(mg.ids[0], b.T.astype(self.dtype))] + list(self.a[1:]))
        head = (mg.handle, trans, n, nrhs, self.a, 1, 1, self.desc, self.ipiv, b_ptrs, 1, 1)
        lwork = ctypes.c_int64(-1)
        status = lib.cusolverMgGetrs_bufferSize(*head, desc_b, self.type, ctypes.byref(lwork))
        if status != 0:
            return status, None, None
        info = ctypes.c_int(-99)
        work = self.workspace(lwork.value)
        status = lib.cusolverMgGetrs(
            *head, desc_b, self.type, work, lwork.value, ctypes.byref(info)
        )
        if status != 0:
            return status, info.value, None
        mg.sync()
        return status, info.value, mg.download(b_ptrs[0], (nrhs, n), self.dtype).T


def random_matrix(n, dtype, seed):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((n, n))
    if np.issubdtype(dtype, np.complexfloating):
        A = A + 1j * rng.standard_normal((n, n))
    return A.astype(dtype)


def reconstruct(lu, piv):
    """P L U as LAPACK defines it: row k was interchanged with row piv[k] (1-based), in order."""
    n = lu.shape[0]
    L = np.tril(lu, -1) + np.eye(n, dtype=lu.dtype)
    rows = np.arange(n)
    for k in range(n):
        rows[[k, piv[k] - 1]] = rows[[piv[k] - 1, k]]
    out = np.empty_like(lu)
    out[rows] = L @ np.triu(lu)
    return out


CASES = [  # (devices, N, T_A): one device; tiles that divide N and those that do not
    ([0], 7, 3),
    ([0, 1], 8, 2),
    ([1, 0], 11, 3),
    ([2, 0, 1], 12, 2),
    ([0, 1, 2], 13, 4),
]


@pytest.mark.parametrize("dtype", [np.float64, np.complex128, np.float32, np.complex64])
@pytest.mark.parametrize(("ids", "n", "tile"), CASES)
def test_getrf_getrs(lib, ids, n, tile, dtype):
    before = violations(lib)[0]
    mg = Mg(lib, ids)
    A = random_matrix(n, dtype, seed=n * 10 + len(ids))
    lu = Lu(mg, A, tile)
    status, info = lu.getrf()
    assert (status, info) == (0, 0)
    factor, piv = lu.result()
    eps = np.finfo(dtype).eps
    scale = np.linalg.norm(A.astype(np.complex128))
    assert np.linalg.norm(reconstruct(factor, piv) - A) < 50 * n * eps * scale
    assert all(k + 1 <= piv[k] <= n for k in range(n))
    if dtype in (np.float64, np.complex128):  # the same algorithm, the same pivots as LAPACK
        expected_lu, expected_piv = scipy.linalg.lu_factor(A)
        np.testing.assert_array_equal(piv, expected_piv + 1)
        np.testing.assert_allclose(factor, expected_lu, atol=1e3 * eps * np.abs(A).max())
    b = random_matrix(n, dtype, seed=1)[:, :3]
    status, info, x = lu.getrs(OP_N, b)
    assert (status, info) == (0, 0)
    expected = np.linalg.solve(A.astype(np.complex128), b.astype(np.complex128))
    cond = np.linalg.cond(A.astype(np.complex128))
    np.testing.assert_allclose(x, expected, atol=100 * n * eps * cond * np.abs(expected).max())
    mg.close()
    assert violations(lib)[0] == before, violations(lib)[1]


@pytest.mark.parametrize(("ids", "n", "tile", "zero"), [([0], 5, 2, 2), ([1, 0], 9, 2, 5)])
def test_singular(lib, ids, n, tile, zero):
    """An exactly zero column gives U(zero, zero) = 0: info = zero + 1, factor complete."""
    mg = Mg(lib, ids)
    A = random_matrix(n, np.float64, seed=3)
    A[:, zero] = 0.0
    lu = Lu(mg, A, tile)
    assert lu.getrf() == (0, zero + 1)
    factor, piv = lu.result()
    assert factor[zero, zero] == 0.0
    np.testing.assert_allclose(reconstruct(factor, piv), A, atol=1e-13 * n)
    mg.close()


def expect_violation(lib, before, *words):
    count, text = violations(lib)
    assert count == before + 1, text
    last = text.splitlines()[-1]
    assert all(w in last for w in words), last


def test_misuse(lib):
    ids, n, tile = [0, 1], 8, 2
    A = random_matrix(n, np.float64, seed=4)
    mg = Mg(lib, ids)
    lu = Lu(mg, A, tile)
    # A workspace below the bufferSize answer.
    before = violations(lib)[0]
    assert lu.getrf(lwork_delta=-1)[0] == 3
    expect_violation(lib, before, "cusolverMgGetrf", "lwork=")
    # getrs on pivots getrf did not write (cudaMalloc'd memory is not zeroed).
    before = violations(lib)[0]
    assert lu.getrs(OP_N, A[:, :2])[0] == 3
    expect_violation(lib, before, "cusolverMgGetrs", "pivots are not getrf's")
    # IPIV swapped between the devices.
    swapped = ptrs([lu.ipiv[1], lu.ipiv[0]])
    lu.ipiv, saved = swapped, lu.ipiv
    before = violations(lib)[0]
    assert lu.getrf_size()[0] == 3
    expect_violation(lib, before, "IPIV[0]", "not device memory on A's grid device 0")
    # IPIV inside A's local columns.
    lu.ipiv = ptrs(list(lu.a))
    before = violations(lib)[0]
    assert lu.getrf_size()[0] == 3
    expect_violation(lib, before, "IPIV[0]", "overlaps A[0]")
    lu.ipiv = saved
    # A TRANS that is not CUBLAS_OP_N, _T or _C.
    assert lu.getrf() == (0, 0)
    before = violations(lib)[0]
    assert lu.getrs(3, A[:, :2])[0] == 3
    expect_violation(lib, before, "cusolverMgGetrs_bufferSize", "TRANS 3")
    mg.close()
    # IPIV one pivot short on each device.
    mg = Mg(lib, ids)
    short = Lu(mg, A, tile, ipiv_extra=-1)
    before = violations(lib)[0]
    assert short.getrf_size()[0] == 3
    expect_violation(lib, before, "IPIV[0]", "needs 16 bytes")
    mg.close()
    # Reading A back before cudaDeviceSynchronize after getrf.
    mg = Mg(lib, ids)
    lu = Lu(mg, A, tile)
    assert lu.getrf() == (0, 0)
    before = violations(lib)[0]
    out = np.empty(n * 4)
    assert lib.cudaMemcpy(out.ctypes.data, lu.a[0], out.nbytes, D2H) != 0
    expect_violation(lib, before, "cudaMemcpy", "cuSolverMg call may still run")
    mg.close()


def test_getrs_takes_op_n_alone(lib):
    """CUBLAS_OP_T and _C: the bufferSize query answers, getrs answers info = -1 and
    CUSOLVER_STATUS_INVALID_VALUE (on the H100: info -1, the status not recorded), B is left
    alone; no violation, it is the library's answer."""
    A = random_matrix(8, np.float64, seed=6)
    mg = Mg(lib, [0, 1])
    lu = Lu(mg, A, 2)
    assert lu.getrf() == (0, 0)
    before = violations(lib)[0]
    for trans in (OP_T, OP_C):
        assert lu.getrs(trans, A[:, :2])[:2] == (3, -1)
    assert violations(lib)[0] == before, violations(lib)[1]
    mg.close()


@pytest.mark.parametrize(("tile", "expected"), [(256, (0, 0)), (512, (0, 0)), (1024, (3, -6))])
def test_getrf_refuses_tiles_of_1024_or_more(lib, tile, expected):
    """As cuSolverMg on the H100 (N = 2048, 4096, 8192: tiles 256 and 512 worked, 1024 and
    more gave info = -6, descrA): the bufferSize query answers, getrf refuses, no violation.
    The emulator's rule does not depend on N: a small one keeps its naive LU fast."""
    n = 12
    A = np.eye(n) + np.tril(np.ones((n, n)), -1) / n  # LU without interchanges
    mg = Mg(lib, [0, 1])
    lu = Lu(mg, A, tile)
    before = violations(lib)[0]
    assert lu.getrf() == expected
    assert violations(lib)[0] == before, violations(lib)[1]
    if expected == (0, 0):
        factor, piv = lu.result()
        np.testing.assert_array_equal(piv, np.arange(1, n + 1))
        np.testing.assert_allclose(np.diag(factor), 1.0)
    mg.close()


@pytest.mark.parametrize("tile", [1024, 2048])
def test_syevd_tiles_over_1024_are_a_violation(lib, tile):
    """syevd ran with tiles up to 1024 on the H100; larger ones were reported rejected (how is
    not recorded): asking is a violation, 1024 is not."""
    n = 4
    mg = Mg(lib, [0])
    desc = mg.desc(n, n, tile, np.float64)
    a = ptrs([mg.malloc(0, 8 * n * tile)])
    w = np.zeros(n)
    lwork = ctypes.c_int64(-1)
    before = violations(lib)[0]
    status = lib.cusolverMgSyevd_bufferSize(
        mg.handle, 1, 0, n, a, 1, 1, desc, w.ctypes.data, 1, 1, ctypes.byref(lwork)
    )
    if tile <= 1024:
        assert status == 0 and lwork.value > 0
        assert violations(lib)[0] == before, violations(lib)[1]
    else:
        assert status == 3
        expect_violation(lib, before, "cusolverMgSyevd_bufferSize", "syevd takes tiles up to 1024")
    mg.close()
