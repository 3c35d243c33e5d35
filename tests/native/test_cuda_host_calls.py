"""jaxmg_cuda's CUDA path (``csrc/engines/cusolvermg.cc``, ``csrc/platforms/cuda_targets.cc``)
without XLA, against numpy.

``run_cuda_on_host`` (a test hook of the native module) stages host arrays on their GPUs and
runs, one thread per mesh position, exactly what the CUDA FFI handlers run: the checks, the
rendezvous (or the cross-process protocol with CUDA IPC), cuSolverMg by the leader, the
outputs. Only XLA's binding of the handler is left out.

- Here and in CI there is no GPU, so the libraries it opens are an emulator
  (``fake_cuda/fake_cuda.cc``): the CUDA runtime, driver and cuSolverMg functions jaxmg uses,
  on host memory, strict about what jaxmg's plumbing must get right (each pointer on the GPU
  it belongs to, streams synchronised before the library reads them, descriptors matching
  the pointer arrays, workspace sizes, IPC handles opened and closed in pairs, no leaks), and
  with asynchronous copies deferred to the next synchronisation. It proves the plumbing, not
  what the real cuSolverMg does.
- On a GPU machine the same cases run on the real libraries (``test_*_on_gpu`` and the
  ``gpu`` variants), every case whatever its device count: mesh position ids are mapped onto
  the GPUs present (``id % count``), so one GPU is listed several times where there are fewer
  GPUs than positions, which cuSolverMg accepts (one H100 listed 2, 3, 4 and 8 times computed
  every case right).
"""

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg
from test_native import from_cyclic, hermitian_pd, to_cyclic

import jaxmg_cuda
import jaxmg_layout

HERE = Path(__file__).parent / "fake_cuda"
DTYPES = ["float32", "float64", "complex64", "complex128"]

pytestmark = pytest.mark.skipif(
    not jaxmg_cuda.has_cuda_support(), reason="jaxmg_cuda was built without CUDA support"
)


@pytest.fixture(scope="module")
def emulator(once_per_suite, fake_cuda):
    """The emulator (tests/conftest.py), under the names jaxmg opens."""
    return str(fake_cuda)


# --- cases --------------------------------------------------------------------------------


def block_buffers(A, moves):
    """Each device's [W, N] buffer of the in-place relayout: its columns of A at its offset."""
    n, ndev = A.shape[0], len(moves.offsets)
    s = n // ndev
    out = np.zeros((ndev, moves.width, n), A.dtype)
    for d, offset in enumerate(moves.offsets):
        out[d, offset : offset + s] = A[:, d * s : (d + 1) * s].T
    return out


def make_case(
    op,
    dtype,
    n,
    tile,
    device_ids,
    *,
    nrhs=3,
    vectors=True,
    aliased=True,
    seed=0,
    spd=True,
    in_place=False,
):
    """One call: its keyword arguments for run_cuda_on_host and what the test needs to check
    the result. ``in_place``: the buffers hold the block layout and the leader relayouts them
    (``jaxmg_layout.in_place_moves``)."""
    ndev = len(device_ids)
    A = hermitian_pd(n, dtype, seed)
    if not spd:
        A[n // 2, n // 2] = -1.0
    moves = None
    if in_place:
        moves = jaxmg_layout.in_place_moves(jaxmg_layout.CyclicPlan.make(n, ndev, tile))
        blocks = block_buffers(A, moves)
    else:
        blocks = to_cyclic(A, ndev, tile).reshape(ndev, -1, n)
    rng = np.random.default_rng(seed + 1)
    b = rng.standard_normal((n, nrhs)).astype(dtype)
    kwargs = dict(
        op=op,
        dtype=dtype,
        n=n,
        local=blocks.shape[1],
        nrhs=nrhs if op == "potrs" else 0,
        tile=tile,
        vectors=vectors,
        aliased=aliased,
        device_ids=list(device_ids),
        positions=list(range(ndev)),
        a=[block.tobytes() for block in blocks],
        b=[np.ascontiguousarray(b.T).tobytes()] * ndev if op == "potrs" else [],
        call_id=0,
        job=0,
        pids=[],
    )
    if moves is not None:
        kwargs.update(
            to_cyclic=moves.to_cyclic.reshape(-1).tolist(),
            from_cyclic=moves.from_cyclic.reshape(-1).tolist(),
        )
    return kwargs, {"A": A, "b": b, "moves": moves}


def unpack(kwargs, result, moves=None):
    """The per-position outputs as global numpy arrays. After an in-place relayout potri and
    syevd return the block layout; potrs leaves its factor in the block-cyclic one."""
    dtype = np.dtype(kwargs["dtype"])
    n, ndev = kwargs["n"], len(kwargs["device_ids"])
    real = np.finfo(dtype).dtype
    blocks = np.stack([np.frombuffer(a, dtype).reshape(kwargs["local"], n) for a in result["a"]])
    if moves is not None and kwargs["op"] != "potrs":
        s = n // ndev
        pieces = [b[o : o + s].T for b, o in zip(blocks, moves.offsets, strict=True)]
        out = {"a": np.concatenate(pieces, axis=1)}
    else:
        width = kwargs["local"]
        out = {"a": from_cyclic(blocks.reshape(-1, n), n, ndev, kwargs["tile"], width)}
    out["x"] = [np.frombuffer(x, dtype).reshape(-1, n).T for x in result["x"]]
    out["w"] = [np.frombuffer(w, real) for w in result["w"]]
    return out


def check(kwargs, data, result):
    """The result of one case against numpy."""
    assert result["errors"] == [""] * len(result["errors"]), result["errors"]
    assert result["status"] == [0] * len(result["status"])
    A, dtype, op = data["A"], np.dtype(kwargs["dtype"]), kwargs["op"]
    n = A.shape[0]
    eps = np.finfo(dtype).eps
    got = unpack(kwargs, result, data.get("moves"))
    lower = np.tril_indices(n)
    if op == "potrs":
        L = np.linalg.cholesky(A.astype(np.complex128))
        np.testing.assert_allclose(got["a"][lower], L[lower], atol=100 * n * eps)
        for x in got["x"]:  # every position has x
            residual = np.linalg.norm(A @ x - data["b"]) / (
                np.linalg.norm(A) * np.linalg.norm(x) * n * eps
            )
            assert residual < 10, residual
    elif op == "potri":
        inverse = np.linalg.inv(A.astype(np.complex128))
        scale = np.linalg.norm(inverse)
        np.testing.assert_allclose(got["a"][lower], inverse[lower], atol=100 * n * eps * scale)
    else:
        expected = np.linalg.eigvalsh(A.astype(np.complex128))
        for w in got["w"]:
            np.testing.assert_allclose(w, expected, atol=100 * n * eps * np.abs(expected).max())
        if kwargs["vectors"]:
            V, w = got["a"], got["w"][0]
            residual = np.linalg.norm(A @ V - V * w) / (np.linalg.norm(A) * n * eps)
            assert residual < 100, residual
            np.testing.assert_allclose(V.conj().T @ V, np.eye(n), atol=100 * n * eps)


def cases_for_emulator():
    cases = {}
    for dtype in DTYPES:
        for ids in ([0], [0, 1], [2, 0, 1]):  # mesh order need not be the GPUs' order
            for op in ("potrs", "potri", "syevd"):
                cases[f"{op}-{dtype}-{len(ids)}dev"] = make_case(op, dtype, 12, 2, ids)
    # Padding (N not a multiple of T_A x devices), many right-hand sides (several chunks),
    # results not aliasing the inputs, eigenvalues only.
    cases["potrs-padded"] = make_case("potrs", "float64", 10, 4, [1, 0], nrhs=9)
    cases["potrs-not-aliased"] = make_case("potrs", "complex128", 12, 2, [0, 1], aliased=False)
    cases["potri-not-aliased"] = make_case("potri", "float32", 12, 2, [0, 1, 2], aliased=False)
    cases["syevd-values"] = make_case("syevd", "complex64", 12, 2, [0, 1], vectors=False)
    cases["syevd-padded"] = make_case("syevd", "float64", 10, 4, [0, 1])
    # The in-place relayout by the leader (block layout in, tiles moved across GPUs): tiles
    # that divide the shard, and tiles that do not (N=15 on 3 GPUs, s=5, T_A=2: offsets 0,1,0).
    for op in ("potrs", "potri", "syevd"):
        for n, tile, dtype in ((12, 2, "float64"), (15, 2, "complex64")):
            cases[f"{op}-in-place-{n}-{dtype}"] = make_case(
                op, dtype, n, tile, [2, 0, 1], in_place=True
            )
    cases["syevd-in-place-values"] = make_case(
        "syevd", "float32", 15, 2, [0, 1, 2], vectors=False, in_place=True
    )
    return cases


def run_calls(folder, calls, tmp_path, env=None):
    """Runs ``calls`` in a fresh process on the libraries in ``folder`` ("-": the real ones)."""
    cases_path, results_path = tmp_path / "cases.pkl", tmp_path / "results.pkl"
    cases_path.write_bytes(pickle.dumps(calls))
    done = subprocess.run(
        [sys.executable, str(HERE / "run_host_calls.py"), cases_path, results_path, folder],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, JAXMG_TIMEOUT_S="20", **(env or {})),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return dict(pickle.loads(results_path.read_bytes()), stderr=done.stderr)


def _gpu_count():
    if shutil.which("nvidia-smi") is None:
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines())


def _real_gpus():
    """The GPUs here; skips without one (fails instead with JAXMG_REQUIRE_GPU=1)."""
    have = _gpu_count()
    if have == 0:
        if os.environ.get("JAXMG_REQUIRE_GPU") == "1":
            pytest.fail("JAXMG_REQUIRE_GPU=1 but no GPU was found (nvidia-smi -L)")
        pytest.skip("no GPU (nvidia-smi -L)")
    return have


def on_gpus(kwargs, gpus):
    """``kwargs``'s call with its device ids mapped onto ``gpus`` GPUs (``id % gpus``): a GPU
    is listed several times where there are fewer GPUs than mesh positions, as cuSolverMg
    accepts."""
    return dict(kwargs, device_ids=[i % gpus for i in kwargs["device_ids"]])


class Libraries:
    """Where the CUDA libraries come from: the emulator's folder, or "-" for the real ones."""

    def __init__(self, folder, gpus):
        self.folder, self.gpus = folder, gpus

    @property
    def emulated(self):
        return self.folder != "-"

    def place(self, kwargs):
        """``kwargs``'s call on the GPUs here (on_gpus); the emulator has 16."""
        return on_gpus(kwargs, self.gpus)

    def assert_clean(self, out, solver_calls=None):
        """The emulator's bookkeeping after a process's calls (nothing to read on real GPUs)."""
        state = out["emulator"]
        if state is None:
            return
        assert state["violations"] == 0, state["violation_text"]
        assert state["live_allocations"] == 0 and state["open_ipc"] == 0
        assert state["queued_ops"] == 0
        assert state["library_busy"] == 0
        if solver_calls is not None:
            assert state["solver_calls"] == solver_calls


@pytest.fixture(params=["emulator", pytest.param("gpu", marks=pytest.mark.gpu)])
def libraries(request):
    """Each test below runs on the emulator (CI) and on real GPUs (skips without one)."""
    if request.param == "emulator":
        return Libraries(request.getfixturevalue("emulator"), 16)
    return Libraries("-", _real_gpus())


# --- on the emulator (CI) -------------------------------------------------------------------

EMULATED = cases_for_emulator()
EMULATED_OPS = ("potrs", "potri", "syevd")


@pytest.fixture(scope="module")
def emulated(emulator, tmp_path_factory):
    """Every emulated case, run in one process; then the emulator's bookkeeping."""
    names = list(EMULATED)
    out = run_calls(emulator, [EMULATED[k][0] for k in names], tmp_path_factory.mktemp("run"))
    return dict(zip(names, out["results"], strict=True)), out["emulator"]


@pytest.mark.parametrize("name", list(EMULATED))
def test_cuda_path_on_emulator(emulated, name):
    results, _ = emulated
    kwargs, data = EMULATED[name]
    check(kwargs, data, results[name])


# --- the factored routines on the emulator ----------------------------------------------------
# potrf and getrf against numpy/scipy; the solves and the inverse from a factor made on the
# host (numpy's Cholesky, scipy's LU: the same pivots as LAPACK's getrf), in the block-cyclic
# layout with the pivots spread like the columns, as the native factor calls leave them.


def general(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        m = m + 1j * rng.standard_normal((n, n))
    return m.astype(dtype)


def column_map(n, ndev, tile, width):
    """Each position's [width] local columns: the global column each holds, -1 for padding."""
    out = np.full((ndev, width), -1)
    for col in range(n):
        k, offset = divmod(col, tile)
        out[k % ndev, (k // ndev) * tile + offset] = col
    return out


def spread_pivots(ipiv, n, ndev, tile, width):
    """LAPACK's 1-based ``ipiv`` ([N]) as each position's [L] int32, like its columns."""
    columns = column_map(n, ndev, tile, width)
    return [np.where(g >= 0, ipiv[np.maximum(g, 0)], 1).astype(np.int32) for g in columns]


def gather_pivots(buffers, n, ndev, tile):
    width = len(buffers[0]) // 4
    ipiv = np.zeros(n, np.int64)
    for d, g in enumerate(column_map(n, ndev, tile, width)):
        local = np.frombuffer(buffers[d], np.int32)
        ipiv[g[g >= 0]] = local[g >= 0]
    return ipiv


def factored_case(op, dtype, n, tile, device_ids, *, trans="N", singular=False, in_place=False):
    """One call of a factored routine: run_cuda_on_host's arguments and the reference data."""
    ndev = len(device_ids)
    A = hermitian_pd(n, dtype) if op.startswith("pot") else general(n, dtype)
    if singular:
        A[:, 4] = 0  # U[4, 4] is exactly zero: status 5
    operand, ipiv = A, None
    if op in ("potrs_factored", "potri_factored"):
        operand = np.linalg.cholesky(A)
    elif op == "getrs":
        lu, piv = scipy.linalg.lu_factor(A)
        operand, ipiv = lu.astype(dtype), piv + 1
    moves = None
    if in_place:
        moves = jaxmg_layout.in_place_moves(jaxmg_layout.CyclicPlan.make(n, ndev, tile))
        blocks = block_buffers(operand, moves)
    else:
        blocks = to_cyclic(operand, ndev, tile).reshape(ndev, -1, n)
    b = np.random.default_rng(1).standard_normal((n, 2)).astype(dtype)
    rhs = op in ("potrs_factored", "getrs")
    kwargs = dict(
        op=op,
        dtype=dtype,
        n=n,
        local=blocks.shape[1],
        nrhs=2 if rhs else 0,
        tile=tile,
        vectors=True,
        aliased=True,
        device_ids=list(device_ids),
        positions=list(range(ndev)),
        a=[block.tobytes() for block in blocks],
        b=[np.ascontiguousarray(b.T).tobytes()] * ndev if rhs else [],
        call_id=0,
        job=0,
        pids=[],
        trans=trans,
    )
    if ipiv is not None:
        width = blocks.shape[1]
        kwargs["ipiv"] = [p.tobytes() for p in spread_pivots(ipiv, n, ndev, tile, width)]
    if moves is not None:  # to the block-cyclic layout only: a factor stays there
        kwargs["to_cyclic"] = moves.to_cyclic.reshape(-1).tolist()
    return kwargs, {"A": A, "b": b}


GETRS_N_ONLY = "cuSolverMg solves only with A itself"


def refused_trans(kwargs):
    """A getrs with trans 'T' or 'C': cuSolverMg's getrs takes 'N' alone (info -1 on an H100
    for the others), so jaxmg refuses it on every position before the library."""
    return kwargs["op"] == "getrs" and kwargs.get("trans", "N") != "N"


def check_factored(kwargs, data, result):
    if refused_trans(kwargs):
        errors, trans = result["errors"], kwargs["trans"]
        assert len(errors) == len(kwargs["positions"]), errors
        expected = f"jaxmg_getrs: trans must be 'N' (as its character code), got {ord(trans)}"
        assert all(e.startswith(expected) and GETRS_N_ONLY in e for e in errors), errors
        return
    assert result["errors"] == [""] * len(result["errors"]), result["errors"]
    A, b, op = data["A"], data["b"], kwargs["op"]
    dtype, n, ndev, tile = (
        np.dtype(kwargs["dtype"]),
        kwargs["n"],
        len(kwargs["device_ids"]),
        kwargs["tile"],
    )
    eps = np.finfo(dtype).eps
    blocks = np.stack([np.frombuffer(a, dtype).reshape(kwargs["local"], n) for a in result["a"]])
    got = from_cyclic(blocks.reshape(-1, n), n, ndev, tile, kwargs["local"])
    lower = np.tril_indices(n)
    big = np.linalg.norm(A)
    if op == "potrf":
        assert result["status"] == [0] * ndev
        L = np.linalg.cholesky(A.astype(np.complex128))
        np.testing.assert_allclose(got[lower], L[lower], atol=100 * n * eps * big)
    elif op == "potri_factored":
        assert result["status"] == [0] * ndev
        inverse = np.linalg.inv(A.astype(np.complex128))
        scale = np.linalg.norm(inverse)
        np.testing.assert_allclose(got[lower], inverse[lower], atol=100 * n * eps * scale)
    elif op == "getrf":
        ipiv = gather_pivots(result["ipiv"], n, ndev, tile)
        if np.all(A[:, 4] == 0):
            assert result["status"] == [5] * ndev  # LAPACK's 1-based index of U's zero pivot
            assert np.isnan(got).all()
            return
        assert result["status"] == [0] * ndev
        lu, piv = scipy.linalg.lu_factor(
            A.astype(np.complex128 if dtype.kind == "c" else np.float64)
        )
        if dtype.itemsize * (2 if dtype.kind != "c" else 1) >= 16:  # double precision
            np.testing.assert_array_equal(ipiv, piv + 1)
        L = np.tril(got, -1) + np.eye(n)
        U = np.triu(got)
        PA = A.copy()
        for i, p in enumerate(ipiv - 1):  # the interchanges, in order
            PA[[i, p]] = PA[[p, i]]
        np.testing.assert_allclose(L @ U, PA, atol=100 * n * eps * big)
    else:  # the solves (with A: trans 'N'): x on every position
        assert result["status"] == [0] * ndev
        for x in result["x"]:
            x = np.frombuffer(x, dtype).reshape(-1, n).T
            residual = np.linalg.norm(A @ x - b) / (big * np.linalg.norm(x) * n * eps)
            assert residual < 100, residual


def factored_cases():
    cases = {}
    for dtype in ("float64", "complex64"):
        for ids in ([0], [2, 0, 1]):
            tag = f"{dtype}-{len(ids)}dev"
            cases[f"potrf-{tag}"] = factored_case("potrf", dtype, 12, 2, ids)
            cases[f"potrs_factored-{tag}"] = factored_case("potrs_factored", dtype, 12, 2, ids)
            cases[f"potri_factored-{tag}"] = factored_case("potri_factored", dtype, 12, 2, ids)
            cases[f"getrf-{tag}"] = factored_case("getrf", dtype, 12, 2, ids)
            for trans in "NTC":  # 'T' and 'C': refused before the library
                cases[f"getrs-{trans}-{tag}"] = factored_case(
                    "getrs", dtype, 12, 2, ids, trans=trans
                )
    # Padding (N not a multiple of T_A x devices), the in-place relayout into a factor, and an
    # exactly singular U.
    cases["getrf-padded"] = factored_case("getrf", "float64", 10, 4, [1, 0])
    cases["getrs-padded"] = factored_case("getrs", "complex128", 10, 4, [1, 0])
    cases["getrs-padded-C"] = factored_case("getrs", "complex128", 10, 4, [1, 0], trans="C")
    cases["potrf-in-place"] = factored_case("potrf", "float64", 15, 2, [2, 0, 1], in_place=True)
    cases["getrf-in-place"] = factored_case("getrf", "complex64", 15, 2, [2, 0, 1], in_place=True)
    cases["getrf-singular"] = factored_case("getrf", "float64", 12, 2, [0, 1], singular=True)
    return cases


FACTORED = factored_cases()


@pytest.fixture(scope="module")
def factored(emulator, tmp_path_factory):
    names = list(FACTORED)
    out = run_calls(emulator, [FACTORED[k][0] for k in names], tmp_path_factory.mktemp("run"))
    return dict(zip(names, out["results"], strict=True)), out["emulator"]


@pytest.mark.parametrize("name", list(FACTORED))
def test_factored_routines_on_emulator(factored, name):
    results, state = factored
    kwargs, data = FACTORED[name]
    check_factored(kwargs, data, results[name])
    assert state["violations"] == 0, state["violation_text"]
    assert state["live_allocations"] == 0 and state["queued_ops"] == 0


# --- chained on the emulator: each factor call's outputs are the next calls' inputs ----------
# potrf's factor into potrs_factored and potri_factored, getrf's LU and returned pivot bytes
# into getrs (N; T and C are refused), as the jaxmg package chains them: one process makes the
# factors, a second one reads them. With the in-place relayout the factor calls take the block
# layout and to_cyclic, and potri_factored brings the inverse back with from_cyclic alone.

CHAINS = {  # name: (dtype, n, tile, device_ids, in_place)
    "float64-3dev": ("float64", 12, 2, [2, 0, 1], False),
    "complex128-padded": ("complex128", 10, 4, [1, 0], False),
    "complex64-in-place": ("complex64", 15, 2, [2, 0, 1], True),
    "float32-1dev": ("float32", 12, 2, [0], False),
}


def chained_calls(factors):
    """The calls reading each chain's factors (``factors``: its potrf and getrf results)."""
    calls = {}
    for name, (dtype, n, tile, ids, in_place) in CHAINS.items():
        potrf, data = factored_case("potrf", dtype, n, tile, ids, in_place=in_place)
        b = [np.ascontiguousarray(data["b"].T).tobytes()] * len(ids)
        reads = dict(potrf, to_cyclic=[], nrhs=2, b=b)
        chol, lu = factors[f"potrf-{name}"], factors[f"getrf-{name}"]
        calls[f"potrs_factored-{name}"] = dict(reads, op="potrs_factored", a=chol["a"])
        back = []
        if in_place:
            plan = jaxmg_layout.CyclicPlan.make(n, len(ids), tile)
            back = jaxmg_layout.in_place_moves(plan).from_cyclic.reshape(-1).tolist()
        calls[f"potri_factored-{name}"] = dict(
            reads, op="potri_factored", a=chol["a"], nrhs=0, b=[], from_cyclic=back
        )
        for trans in "NTC":
            calls[f"getrs-{trans}-{name}"] = dict(
                reads, op="getrs", a=lu["a"], ipiv=lu["ipiv"], trans=trans
            )
    # A factor is block-cyclic already: to_cyclic moves with it are refused on every position.
    dtype, n, tile, ids, _ = CHAINS["complex64-in-place"]
    potrf, _ = factored_case("potrf", dtype, n, tile, ids, in_place=True)
    calls["potri_factored-to_cyclic-refused"] = dict(
        potrf, op="potri_factored", a=factors["potrf-complex64-in-place"]["a"]
    )
    return calls


@pytest.fixture(scope="module")
def chained(emulator, tmp_path_factory):
    """The factor calls in one process, the calls reading their outputs in a second one."""
    first = {}
    for name, (dtype, n, tile, ids, in_place) in CHAINS.items():
        for op in ("potrf", "getrf"):
            first[f"{op}-{name}"] = factored_case(op, dtype, n, tile, ids, in_place=in_place)[0]
    out1 = run_calls(emulator, list(first.values()), tmp_path_factory.mktemp("run"))
    factors = dict(zip(first, out1["results"], strict=True))
    second = chained_calls(factors)
    out2 = run_calls(emulator, list(second.values()), tmp_path_factory.mktemp("run"))
    results = dict(factors, **dict(zip(second, out2["results"], strict=True)))
    return results, {"factors": out1["emulator"], "reads": out2["emulator"]}, first, second


@pytest.mark.parametrize("chain", list(CHAINS))
def test_factors_chained_on_emulator(chained, chain):
    results, _, first, second = chained
    dtype, n, tile, ids, in_place = CHAINS[chain]
    _, data = factored_case("potrf", dtype, n, tile, ids, in_place=in_place)
    _, general_data = factored_case("getrf", dtype, n, tile, ids, in_place=in_place)
    check_factored(first[f"potrf-{chain}"], data, results[f"potrf-{chain}"])
    check_factored(first[f"getrf-{chain}"], general_data, results[f"getrf-{chain}"])
    check_factored(second[f"potrs_factored-{chain}"], data, results[f"potrs_factored-{chain}"])
    for trans in "NTC":
        name = f"getrs-{trans}-{chain}"
        check_factored(second[name], general_data, results[name])
    name = f"potri_factored-{chain}"
    kwargs, result = second[name], results[name]
    if not in_place:
        check_factored(kwargs, data, result)
        return
    # From the block-cyclic factor back to the block layout: device d's columns at its offset.
    assert result["errors"] == [""] * len(ids) and result["status"] == [0] * len(ids)
    moves = jaxmg_layout.in_place_moves(jaxmg_layout.CyclicPlan.make(n, len(ids), tile))
    s = n // len(ids)
    blocks = [np.frombuffer(a, dtype).reshape(moves.width, n) for a in result["a"]]
    got = np.concatenate(
        [b[o : o + s].T for b, o in zip(blocks, moves.offsets, strict=True)], axis=1
    )
    inverse = np.linalg.inv(data["A"].astype(np.complex128))
    np.testing.assert_allclose(
        np.tril(got), np.tril(inverse), atol=100 * n * np.finfo(dtype).eps * np.abs(inverse).max()
    )


def test_factor_with_to_cyclic_is_refused_on_emulator(chained):
    results, _, _, _ = chained
    errors = results["potri_factored-to_cyclic-refused"]["errors"]
    assert len(errors) == 3, errors
    assert all(
        "jaxmg_potri_factored: takes its factor in the block-cyclic layout" in e for e in errors
    ), errors


@pytest.mark.parametrize("run", ["emulated", "factored", "chained-factors", "chained-reads"])
def test_emulator_saw_no_misuse_and_nothing_leaked(request, run):
    """What the emulator checks on every call: no violation (wrong device, unsynchronised
    stream, descriptor or workspace mismatch), every allocation freed, every stream drained.
    The cuSolverMg handles and descriptors are cached for the process, by design. One process
    each: the routines of A, the factored ones, and the two halves of the chained calls."""
    if run == "emulated":
        state, calls = request.getfixturevalue("emulated")[1], len(EMULATED)
    elif run == "factored":
        state = request.getfixturevalue("factored")[1]
        calls = sum(not refused_trans(kw) for kw, _ in FACTORED.values())
    else:
        _, states, first, second = request.getfixturevalue("chained")
        half = run.split("-")[1]
        # Every call reaches the library but the refused ones.
        state = states[half]
        calls = len(first) if half == "factors" else len(second) - 1
        if half == "reads":
            calls -= sum(refused_trans(kw) for kw in second.values())
    assert state["violations"] == 0, state["violation_text"]
    assert state["live_allocations"] == 0
    assert state["queued_ops"] == 0
    assert state["library_busy"] == 0  # every device synchronised after each library call
    assert state["open_ipc"] == 0
    assert state["solver_calls"] >= calls


# --- on the emulator and, where there are enough GPUs, on real ones ---------------------------


@pytest.mark.parametrize("in_place", [False, True], ids=["cyclic", "in-place"])
@pytest.mark.parametrize("dtype", ["float64", "complex64"])
@pytest.mark.parametrize("op", ["potrs", "potri"])
def test_not_positive_definite(libraries, tmp_path, op, dtype, in_place):
    """cuSolverMg's info > 0 (LAPACK's: the order of the first minor that is not positive
    definite) becomes every position's status; x (potrs) or the inverse (potri) is NaN."""
    ids = [0, 1]
    kwargs, data = make_case(op, dtype, 12, 2, ids, spd=False, in_place=in_place)  # A[6,6] = -1
    kwargs = libraries.place(kwargs)
    out = run_calls(libraries.folder, [kwargs], tmp_path)
    result = out["results"][0]
    assert result["errors"] == [""] * len(ids)
    assert result["status"] == [7] * len(ids)
    got = unpack(kwargs, result, data["moves"])
    if op == "potrs":
        assert all(np.isnan(x).all() for x in got["x"])
    else:
        assert np.isnan(got["a"]).all()
    libraries.assert_clean(out)


@pytest.mark.parametrize("status", [6, 7])  # EXECUTION_FAILED, INTERNAL_ERROR
def test_not_positive_definite_flagged_by_status_on_emulator(emulator, tmp_path, status):
    """Should cuSolverMg flag a matrix that is not positive definite with a failing status as
    well as info > 0 (unknown until a GPU run), it is still a status and NaN, not an error."""
    kwargs, _ = make_case("potrs", "float64", 12, 2, [0, 1], spd=False)
    out = run_calls(emulator, [kwargs], tmp_path, env={"FAKECUDA_NOT_PD_STATUS": str(status)})
    result = out["results"][0]
    assert result["errors"] == ["", ""] and result["status"] == [7, 7]
    assert all(np.isnan(x).all() for x in unpack(kwargs, result)["x"])


def test_not_positive_definite_flagged_by_status_alone_on_emulator(emulator, tmp_path):
    """cusolverMgPotrf returning CUSOLVER_STATUS_INTERNAL_ERROR with info 0 for a matrix that
    is not positive definite (what the cuSolverMg-era jaxmg's GPU tests saw): status N + 1,
    "not positive definite, order unknown", and NaN; not an error."""
    kwargs, _ = make_case("potrs", "float64", 12, 2, [0, 1], spd=False)
    env = {"FAKECUDA_NOT_PD_STATUS": "7", "FAKECUDA_NOT_PD_ZERO_INFO": "1"}
    out = run_calls(emulator, [kwargs], tmp_path, env=env)
    result = out["results"][0]
    assert result["errors"] == ["", ""] and result["status"] == [13, 13]
    assert all(np.isnan(x).all() for x in unpack(kwargs, result)["x"])


def test_other_failing_status_without_info_is_an_error_on_emulator(emulator, tmp_path):
    """Any other failing status without info (here EXECUTION_FAILED) is the library's error,
    raised on every position with its name."""
    kwargs, _ = make_case("potri", "float64", 12, 2, [0, 1], spd=False)
    env = {"FAKECUDA_NOT_PD_STATUS": "6", "FAKECUDA_NOT_PD_ZERO_INFO": "1"}
    errors = run_calls(emulator, [kwargs], tmp_path, env=env)["results"][0]["errors"]
    assert len(errors) == 2 and all("CUSOLVER_STATUS_EXECUTION_FAILED" in e for e in errors)


@pytest.mark.parametrize("op", EMULATED_OPS)
def test_illegal_argument_is_an_error_on_emulator(emulator, tmp_path, op):
    """cuSolverMg rejecting an argument (info < 0) is jaxmg's bug: an error on every position
    naming the routine and the argument, as the CPU twin does, never a status."""
    kwargs, _ = make_case(op, "float64", 12, 2, [0, 1])
    out = run_calls(emulator, [kwargs], tmp_path, env={"FAKECUDA_ILLEGAL_ARGUMENT": "4"})
    errors = out["results"][0]["errors"]
    routine = "cusolverMgSyevd" if op == "syevd" else "cusolverMgPotrf"
    assert len(errors) == 2, errors
    assert all(f"{routine} rejected argument 4 as illegal" in e for e in errors), errors


def test_without_peer_access_on_emulator(emulator, tmp_path):
    """cudaDeviceEnablePeerAccess failing (cudaErrorTooManyPeers, past 8 PCIe GPUs): the calls
    go on without peer access, right, and the process says so once."""
    calls = [make_case(op, "float64", 15, 2, [2, 0, 1], in_place=True) for op in EMULATED_OPS]
    out = run_calls(emulator, [k for k, _ in calls], tmp_path, env={"FAKECUDA_PEER_ERROR": "711"})
    for (kwargs, data), result in zip(calls, out["results"], strict=True):
        check(kwargs, data, result)
    assert out["stderr"].count("peer access from GPU") == 1, out["stderr"]
    state = out["emulator"]
    assert state["violations"] == 0, state["violation_text"]


@pytest.mark.parametrize(
    ("op", "tile", "refusal"),
    [
        ("getrf", 512, None),
        ("getrf", 1024, "cuSolverMg's getrf refuses a column tile of 1024 or more"),
        ("syevd", 1024, None),
        ("syevd", 2048, "cuSolverMg's syevd takes a column tile of at most 1024, got T_A=2048"),
    ],
)
def test_tiles_cusolvermg_refuses_are_refused_before_it(libraries, tmp_path, op, tile, refusal):
    """cuSolverMg's getrf answered a tile of 1024 or more with info -6 on an H100 (512 worked),
    and its syevd takes tiles up to 1024: jaxmg refuses the others on every position before
    any library call, and runs the rest right."""
    if op == "getrf":
        kwargs, data = factored_case(op, "float64", 12, tile, [0, 1])
    else:
        kwargs, data = make_case(op, "float64", 12, tile, [0, 1])
    kwargs = libraries.place(kwargs)
    out = run_calls(libraries.folder, [kwargs], tmp_path)
    result = out["results"][0]
    if refusal is None:
        (check_factored if op == "getrf" else check)(kwargs, data, result)
        libraries.assert_clean(out, solver_calls=1)
        return
    errors = result["errors"]
    assert len(errors) == 2 and all(f"jaxmg_{op}: {refusal}" in e for e in errors), errors
    libraries.assert_clean(out, solver_calls=0)


REPEATED = {  # one GPU listed several times, and GPUs listed in turn
    "potrs-[0,0]": ("potrs", "float64", 8, 2, [0, 0], False),
    "potri-[3,3,3]": ("potri", "complex128", 12, 2, [3, 3, 3], False),
    "syevd-[1,0,1,0]": ("syevd", "float32", 16, 2, [1, 0, 1, 0], False),
    "potrs-in-place-[2,2,2]": ("potrs", "complex64", 15, 2, [2, 2, 2], True),
    "syevd-in-place-[0,1,0]": ("syevd", "float64", 15, 2, [0, 1, 0], True),
}


@pytest.mark.parametrize("name", list(REPEATED))
def test_repeated_gpu_runs_right(libraries, tmp_path, name):
    """Several mesh positions on one GPU: cuSolverMg takes such a device list and computes
    right (one H100 listed 2, 3, 4 and 8 times: 54 of 54 cases), so jaxmg runs it; with the
    in-place relayout the tiles move between positions that share a GPU."""
    op, dtype, n, tile, ids, in_place = REPEATED[name]
    kwargs, data = make_case(op, dtype, n, tile, ids, in_place=in_place)
    kwargs = libraries.place(kwargs)
    out = run_calls(libraries.folder, [kwargs], tmp_path)
    check(kwargs, data, out["results"][0])
    # potrf, then potrs on 3 right-hand sides in chunks of T_A = 2, or potri; one syevd.
    libraries.assert_clean(out, solver_calls={"potrs": 3, "potri": 2, "syevd": 1}[op])


def test_repeated_gpu_lu_runs_right(libraries, tmp_path):
    """getrf with one GPU listed twice, against scipy, and a solve from its factor."""
    kwargs, data = factored_case("getrf", "complex128", 12, 2, [1, 1])
    kwargs = libraries.place(kwargs)
    out = run_calls(libraries.folder, [kwargs], tmp_path)
    check_factored(kwargs, data, out["results"][0])
    libraries.assert_clean(out, solver_calls=1)


def run_one_position_per_process(folder, kwargs, tmp_path):
    """``kwargs``'s call with each mesh position in a process of its own (the multi-process
    protocol); returns what each process saw."""
    job = int.from_bytes(os.urandom(6), "little") | 1
    procs = []
    for position in range(len(kwargs["device_ids"])):
        call = dict(kwargs, positions=[position], a=[kwargs["a"][position]], job=job)
        call["b"] = [kwargs["b"][position]] if kwargs["b"] else []
        work = tmp_path / f"p{position}"
        work.mkdir()
        (work / "cases.pkl").write_bytes(pickle.dumps([call]))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "run_host_calls.py")]
                + [work / "cases.pkl", work / "results.pkl", folder],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=dict(os.environ, JAXMG_TIMEOUT_S="20", JAXMG_HOST_CALL_PIDS_FROM_STDIN="1"),
            )
        )
    try:
        pids = [int(p.stdout.readline()) for p in procs]
        for p in procs:
            p.stdin.write(" ".join(map(str, pids)) + "\n")
            p.stdin.flush()
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
    finally:
        for p in procs:
            p.kill()
    return [
        pickle.loads((tmp_path / f"p{q}" / "results.pkl").read_bytes()) for q in range(len(procs))
    ]


def merged(outs):
    """One result dict from each process's single position."""
    keys = ("a", "x", "w", "status", "errors")
    return {key: [out["results"][0][key][0] for out in outs] for key in keys}


@pytest.mark.parametrize("in_place", [False, True], ids=["cyclic", "in-place"])
@pytest.mark.parametrize("op", ["potrs", "syevd"])
def test_processes_share_by_cuda_ipc(libraries, tmp_path, op, in_place):
    """The multi-process GPU protocol on 3 processes: the others share their buffers as CUDA
    IPC handles, position 0's process maps them, runs the library for all (and moves tiles
    between the mapped buffers, in place), closes them."""
    kwargs, data = make_case(op, "complex128", 15, 2, [2, 0, 1], nrhs=2, in_place=in_place)
    kwargs = libraries.place(kwargs)
    outs = run_one_position_per_process(libraries.folder, kwargs, tmp_path)
    check(kwargs, data, merged(outs))
    for position, out in enumerate(outs):  # only the leader runs the library
        libraries.assert_clean(out, solver_calls=None if position == 0 else 0)


def test_two_processes_on_one_gpu_run_right(libraries, tmp_path):
    """Two processes on one GPU: the leader maps the other's memory (CUDA IPC works on one
    GPU) and runs cuSolverMg with the GPU listed twice, which it accepts; both processes get
    the right inverse, every handle closed. (Two jax processes on one GPU are refused by jax's
    own NCCL first, "Duplicate GPU detected"; this runs the CUDA layer alone.)"""
    kwargs, data = make_case("potri", "float64", 8, 2, [0, 0])
    outs = run_one_position_per_process(libraries.folder, kwargs, tmp_path)
    check(kwargs, data, merged(outs))
    for position, out in enumerate(outs):  # only the leader runs the library
        libraries.assert_clean(out, solver_calls=None if position == 0 else 0)


# --- every emulated case on real GPUs, mapped onto the GPUs present --------------------------


@pytest.mark.gpu
def test_cuda_path_on_gpu(tmp_path):
    """Every emulated case on the real CUDA runtime and cuSolverMg, its device ids mapped onto
    the GPUs here (on_gpus)."""
    have = _real_gpus()
    names = list(EMULATED)
    calls = [on_gpus(EMULATED[k][0], have) for k in names]
    out = run_calls("-", calls, tmp_path)
    failures = []
    for name, call, result in zip(names, calls, out["results"], strict=True):
        try:
            check(call, EMULATED[name][1], result)
        except AssertionError as error:
            failures.append(f"{name}: {error}")
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
def test_factored_routines_on_gpu(tmp_path):
    """Every factored case on the real CUDA runtime and cuSolverMg, its device ids mapped onto
    the GPUs here (on_gpus)."""
    have = _real_gpus()
    names = list(FACTORED)
    calls = [on_gpus(FACTORED[k][0], have) for k in names]
    out = run_calls("-", calls, tmp_path)
    failures = []
    for name, call, result in zip(names, calls, out["results"], strict=True):
        try:
            check_factored(call, FACTORED[name][1], result)
        except AssertionError as error:
            failures.append(f"{name}: {error}")
    assert not failures, "\n".join(failures)
