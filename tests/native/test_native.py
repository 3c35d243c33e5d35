"""The native targets of jaxmg_cuda, called directly through jax.ffi inside shard_map.

The block-cyclic operands are built here with a small numpy loop (independent of
jaxmg_layout) and results are checked against numpy with LAPACK-style scaled residuals. The
CPU twin runs the same rendezvous as the CUDA targets, so these tests exercise the
multi-device machinery on every simulated device count. The tests on one device of their own
(lowering, call ids, imports, the cross-process error paths) run once, with 4 devices.
"""

import functools
import os
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxmg_cuda

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
ROWS = P("x", None)


def eps(dtype):
    return np.finfo(dtype).eps


def to_cyclic(A, ndev, tile):
    """Global [ndev*L, N] array whose row block d is device d's column-major N x L block."""
    n = A.shape[0]
    s = n // ndev
    width = -(-s // tile) * tile
    out = np.zeros((ndev * width, n), A.dtype)
    for col in range(n):
        k, offset = divmod(col, tile)
        out[(k % ndev) * width + (k // ndev) * tile + offset, :] = A[:, col]
    return out


def from_cyclic(out, n, ndev, tile, width=None):
    s = n // ndev
    width = width or -(-s // tile) * tile
    A = np.zeros((n, n), out.dtype)
    for col in range(n):
        k, offset = divmod(col, tile)
        A[:, col] = out[(k % ndev) * width + (k // ndev) * tile + offset, :]
    return A


def hermitian_pd(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        m = m + 1j * rng.standard_normal((n, n))
    return (m @ m.conj().T / n + np.eye(n)).astype(dtype)


def run(routine, A, tile, devices, b=None, vectors=True, device_ids=None):
    """One native call on ``devices``; returns host numpy outputs."""
    ids = tuple(d.id for d in devices) if device_ids is None else tuple(device_ids)
    fn, mesh = native_call(routine, tile, tuple(devices), ids, vectors)
    a = jax.device_put(to_cyclic(A, len(devices), tile), NamedSharding(mesh, ROWS))
    args = (a,) if routine != "potrs" else (a, jax.device_put(b, NamedSharding(mesh, P())))
    return [np.asarray(o) for o in fn(*args)]


@functools.cache
def native_call(routine, tile, devices, ids, vectors):
    """The jitted shard_map of one native call and its mesh, built once per configuration: jax
    then compiles it once per shape and dtype, and a test calling it again runs the same
    program (as a user's jitted function does), not a new one."""
    mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)

    def local(a, *rest):
        pos = jax.lax.axis_index("x")
        if routine == "potrs":
            return jaxmg_cuda.mg_potrs(a, rest[0], pos, T_A=tile, device_ids=list(ids))
        if routine == "potri":
            return jaxmg_cuda.mg_potri(a, pos, T_A=tile, device_ids=list(ids))
        return jaxmg_cuda.mg_syevd(a, pos, T_A=tile, device_ids=list(ids), vectors=vectors)

    # Results that are "the same on every device" come back stacked per device, so the test
    # sees every device's copy.
    per_device = P("x")
    if routine == "potrs":
        in_specs, out_specs = (ROWS, P()), (ROWS, per_device, per_device)
    elif routine == "potri":
        in_specs, out_specs = (ROWS,), (ROWS, per_device)
    else:
        in_specs, out_specs = (ROWS,), (ROWS, per_device, per_device)

    def stacked(*xs):
        outs = local(*xs)
        return tuple(o if i == 0 else o[None] for i, o in enumerate(outs))

    fn = jax.jit(
        jax.shard_map(stacked, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    )
    return fn, mesh


def scaled_residual(A, x, b):
    n = A.shape[0]
    return np.linalg.norm(A @ x - b) / (
        np.linalg.norm(A, 1) * max(np.linalg.norm(x), 1e-300) * n * eps(A.dtype)
    )


def sizes(ndev):
    """(N, T_A) cases: a partial last tile, several tiles per device, one tile per device."""
    return [(ndev * 10, 3), (ndev * 8, 4), (ndev * 5, 5)]


@pytest.fixture(params=["cpu", "gpu"])
def devices(request):
    """The CPU twin on the simulated devices, and the cuSolverMg path on the visible GPUs. The
    GPU variants skip without a GPU: the cuSolverMg layer has never run on hardware yet."""
    if request.param == "gpu":
        return request.getfixturevalue("gpu_devices")  # skip reason says: never run on GPU
    return jax.devices("cpu")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_potrs(devices, dtype):
    for n, tile in sizes(len(devices)):
        A = hermitian_pd(n, dtype, seed=n)
        B = np.random.default_rng(1).standard_normal((n, 3)).astype(dtype)
        factor, x, status = run("potrs", A, tile, devices, b=np.ascontiguousarray(B.T))
        assert (status == 0).all()
        for xd in x:  # every device holds the full solution
            assert scaled_residual(A, xd.T, B) < 30
        L = np.tril(from_cyclic(factor, n, len(devices), tile))
        np.testing.assert_allclose(L, np.linalg.cholesky(A), atol=1e3 * eps(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_potri(devices, dtype):
    for n, tile in sizes(len(devices)):
        A = hermitian_pd(n, dtype, seed=n)
        inv, status = run("potri", A, tile, devices)
        assert (status == 0).all()
        lower = np.tril(from_cyclic(inv, n, len(devices), tile))
        full = lower + np.tril(lower, -1).conj().T
        r = np.linalg.norm(full @ A - np.eye(n)) / (
            np.linalg.norm(A, 1) * np.linalg.norm(full, 1) * n * eps(dtype)
        )
        assert r < 30


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("vectors", [True, False], ids=["vectors", "values"])
def test_syevd(devices, dtype, vectors):
    for n, tile in sizes(len(devices)):
        M = hermitian_pd(n, dtype, seed=n)
        A = ((M + M.conj().T) / 2 - 1.5 * np.eye(n)).astype(dtype)  # indefinite is fine
        v, w, status = run("syevd", A, tile, devices, vectors=vectors)
        assert (status == 0).all()
        expected = np.linalg.eigvalsh(
            A.astype(np.complex128 if A.dtype.kind == "c" else np.float64)
        )
        for wd in w:
            assert wd.dtype == np.finfo(dtype).dtype
            assert np.all(np.diff(wd) >= 0)
            np.testing.assert_allclose(
                wd, expected, atol=30 * n * eps(dtype) * np.abs(expected).max()
            )
        if vectors:
            V = from_cyclic(v, n, len(devices), tile)
            orth = np.linalg.norm(V.conj().T @ V - np.eye(n)) / (n * eps(dtype))
            assert orth < 30
            res = np.linalg.norm(A @ V - V * w[0]) / (np.linalg.norm(A, 1) * n * eps(dtype))
            assert res < 30


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
def test_not_positive_definite_gives_status_and_nan(devices, dtype):
    n, tile = 6 * len(devices), 2
    A = hermitian_pd(n, dtype)
    A[3, 3] = -100  # leading minor of order 4 is not positive definite
    _, x, status = run("potrs", A, tile, devices, b=np.ones((1, n), dtype))
    assert (status == 4).all()  # LAPACK's info on every device
    assert np.isnan(x).all()
    inv, status = run("potri", A, tile, devices)
    assert (status == 4).all()
    assert np.isnan(from_cyclic(inv, n, len(devices), tile)).all()


def test_handlers_run_concurrently(cpu_devices):
    """XLA runs the handlers of one call at the same time, one host thread per device: every
    participant is inside the rendezvous at once (else this call could not complete)."""
    ndev = len(cpu_devices)
    mesh = jax.make_mesh((ndev,), ("x",), devices=cpu_devices)
    ids = [d.id for d in cpu_devices]

    def local():
        return jaxmg_cuda.rendezvous_probe(jax.lax.axis_index("x"), device_ids=ids)[None]

    fn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(), out_specs=P("x"), check_vma=False))
    for _ in range(3):
        out = np.asarray(fn())
        assert out.tolist() == [[ndev, ndev]] * ndev  # ndev participants on ndev threads


def test_many_consecutive_calls(cpu_devices):
    """200 calls, each with another routine and dtype than the call before, N and T_A varying:
    all correct, no deadlock, nothing open. They cycle through 24 programs (every routine x
    dtype twice; every N / ndev in 2..5 with every T_A up to it), each compiled once and run
    again on new matrices, as a user's jitted function is."""
    ndev = len(cpu_devices)
    shapes = [(per_device, tile) for per_device in range(2, 6) for tile in range(1, per_device + 1)]
    routines = ("potrs", "potri", "syevd")
    programs = [(routines[j % 3], DTYPES[j % 4], *shapes[j % len(shapes)]) for j in range(24)]
    for i in range(200):
        routine, dtype, per_device, tile = programs[i % len(programs)]
        n = ndev * per_device
        A = hermitian_pd(n, dtype, seed=i)
        if routine == "potrs":
            b = np.ones((1, n), dtype)
            _, x, status = run("potrs", A, tile, cpu_devices, b=b)
            assert scaled_residual(A, x[0].T, b.T) < 30, i
        elif routine == "potri":
            inv, status = run("potri", A, tile, cpu_devices)
            lower = np.tril(from_cyclic(inv, n, ndev, tile))
            full = lower + np.tril(lower, -1).conj().T
            assert np.linalg.norm(full @ A - np.eye(n)) < 1e3 * n * eps(dtype), i
        else:
            _, w, status = run("syevd", A, tile, cpu_devices, vectors=False)
            np.testing.assert_allclose(w[0], np.linalg.eigvalsh(A), rtol=1e3 * eps(dtype))
        assert (status == 0).all(), i
    assert jaxmg_cuda.open_meetings() == 0


def test_many_right_hand_sides_and_one_tile(cpu_devices):
    """More right-hand sides than any chunk (300), and T_A >= N (one tile on position 0)."""
    ndev = len(cpu_devices)
    n = 4 * ndev
    A = hermitian_pd(n, np.complex128)
    B = np.random.default_rng(2).standard_normal((n, 300)).astype(np.complex128)
    for tile in (3, n):
        _, x, status = run("potrs", A, tile, cpu_devices, b=np.ascontiguousarray(B.T))
        assert (status == 0).all()
        assert scaled_residual(A, x[-1].T, B) < 30


def test_unknown_device_ids_are_fine(cpu_devices):
    """Under an abstract mesh the device ids are unknown (-1): only their count matters."""
    ndev = len(cpu_devices)
    A = hermitian_pd(4 * ndev, np.float64)
    b = np.ones((1, 4 * ndev))
    _, x, status = run("potrs", A, 2, cpu_devices, b=b, device_ids=[-1] * ndev)
    assert (status == 0).all()
    assert scaled_residual(A, x[0].T, b.T) < 30


def test_duplicate_position_errors_everywhere(cpu_devices):
    """Two participants claiming one mesh position: every device errors, nothing hangs."""
    ndev = len(cpu_devices)
    if ndev < 2:
        pytest.skip("needs at least 2 devices")
    mesh = jax.make_mesh((ndev,), ("x",), devices=cpu_devices)
    a = jax.device_put(
        to_cyclic(hermitian_pd(2 * ndev, np.float64), ndev, 2), NamedSharding(mesh, ROWS)
    )

    def local(a):
        zero = jnp.zeros((), jnp.int32)  # every participant says "position 0"
        return jaxmg_cuda.mg_potri(a, zero, T_A=2, device_ids=list(range(ndev)))

    fn = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=ROWS, out_specs=(ROWS, P()), check_vma=False)
    )
    with pytest.raises(Exception, match="two participants claim mesh position 0"):
        jax.block_until_ready(fn(a))
    assert jaxmg_cuda.open_meetings() == 0
    inv, status = run("potri", hermitian_pd(2 * ndev, np.float64), 2, cpu_devices)
    assert (status == 0).all()


FAULT_SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {here!r})
    import jax
    jax.config.update("jax_num_cpu_devices", {ndev})
    import numpy as np
    import test_native as t
    devices = jax.devices("cpu")
    A = t.hermitian_pd(4 * len(devices), np.float64)
    start = time.monotonic()
    try:
        # One more participant than devices: the call can never gather everyone.
        t.run("potrs", A, 2, devices, b=np.ones((1, A.shape[0])),
              device_ids=[d.id for d in devices] + [99])
    except Exception as err:
        print("FAILED-AS-EXPECTED", round(time.monotonic() - start, 1), str(err)[:2000])
    else:
        print("NO-ERROR")
    _, x, status = t.run("potrs", A, 2, devices, b=np.ones((1, A.shape[0])))
    print("NEXT-CALL", int(status.max()), bool(np.isfinite(x).all()))
    import jaxmg_cuda
    print("OPEN", jaxmg_cuda.open_meetings())
    """
)


def test_missing_participant_fails_everyone_within_deadline(cpu_devices):
    script = FAULT_SCRIPT.format(here=os.path.dirname(__file__), ndev=len(cpu_devices))
    env = dict(os.environ, JAXMG_TIMEOUT_S="2")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    out = done.stdout
    assert "FAILED-AS-EXPECTED" in out, out + done.stderr
    assert "timed out after 2 s" in out
    assert f"{len(cpu_devices)} of {len(cpu_devices) + 1} arrived" in out
    seconds = float(out.split("FAILED-AS-EXPECTED")[1].split()[0])
    assert seconds < 30
    assert "NEXT-CALL 0 True" in out
    assert "OPEN 0" in out


def test_bad_operand_reaches_every_participant(cpu_devices):
    """A malformed call (T_A not dividing the local width) errors on every device, no hang."""
    ndev = len(cpu_devices)
    mesh = jax.make_mesh((ndev,), ("x",), devices=cpu_devices)
    a = jax.device_put(np.eye(5 * ndev, dtype=np.float64)[: 5 * ndev], NamedSharding(mesh, ROWS))

    def local(a):
        return jaxmg_cuda.mg_potri(a, jax.lax.axis_index("x"), T_A=2, device_ids=list(range(ndev)))

    fn = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=ROWS, out_specs=(ROWS, P()), check_vma=False)
    )
    with pytest.raises(Exception, match="not a multiple of T_A=2"):
        jax.block_until_ready(fn(a))
    assert jaxmg_cuda.open_meetings() == 0


@pytest.mark.parametrize(
    "moves, message",
    [
        ([[0, 3, 0, 2]], "move 0 \\(0, 3, 0, 2\\) is out of round order or not a column"),
        ([[0, 0, 1, 2]], "to a disjoint one"),  # overlaps its own source
        ([[0, 0, 2, 0]], "not a column range"),  # empty
        ([[1, 0, 2, 1], [0, 2, 0, 1]], "move 1 .* out of round order"),
        ([[0, 1]], "to_cyclic must be \\(round, source, destination, width\\) rows"),  # Python
    ],
)
def test_bad_moves_reach_every_participant(cpu_devices, moves, message):
    """Relayout moves the native executor must not run are refused by name, on every device."""
    ndev = len(cpu_devices)
    mesh = jax.make_mesh((ndev,), ("x",), devices=cpu_devices)
    a = jax.device_put(np.eye(4 * ndev, dtype=np.float64), NamedSharding(mesh, ROWS))
    flat = np.asarray(moves, np.int64).reshape(-1)

    def local(a):
        return jaxmg_cuda.mg_potri(
            a, jax.lax.axis_index("x"), T_A=2, device_ids=list(range(ndev)), moves=(flat, None)
        )

    fn = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=ROWS, out_specs=(ROWS, P()), check_vma=False)
    )
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(fn(a))
    assert jaxmg_cuda.open_meetings() == 0


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.parametrize("routine", ["potrs", "potri", "syevd"])
def test_cuda_lowering_on_cpu(cpu_devices, routine):
    """Lowered for CUDA (on a machine without a GPU), each call names our custom call with its
    attributes and the aliasing of ``a`` (and ``b``) into the results."""
    mesh = jax.make_mesh((1,), ("x",), devices=cpu_devices[:1])
    a = jax.device_put(jnp.zeros((8, 8), jnp.complex64), NamedSharding(mesh, ROWS))
    b = jax.device_put(jnp.zeros((1, 8), jnp.complex64), NamedSharding(mesh, P()))

    def local(a, b):
        pos = jax.lax.axis_index("x")
        if routine == "potrs":
            return jaxmg_cuda.mg_potrs(a, b, pos, T_A=4, device_ids=[0])
        if routine == "potri":
            return jaxmg_cuda.mg_potri(a, pos, T_A=4, device_ids=[0])
        return jaxmg_cuda.mg_syevd(a, pos, T_A=4, device_ids=[0], vectors=False)

    n_out = {"potrs": 3, "potri": 2, "syevd": 3}[routine]
    fn = jax.jit(
        jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(ROWS, P()),
            out_specs=(ROWS,) + (P(),) * (n_out - 1),
            check_vma=False,
        )
    )
    text = fn.trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    assert f"custom_call @jaxmg_{routine}(" in text
    assert "T_A = 4 : i64" in text
    assert "call_id = " in text
    assert "device_ids = dense<0> : tensor<1xi64>" in text
    assert "output_operand_aliases" in text
    if routine == "potrs":
        assert "output_tuple_indices = [1], operand_index = 1" in text
    if routine == "syevd":
        assert "vectors = false" in text
        assert "tensor<8xf32>" in text  # w has the real dtype


@pytest.mark.usefixtures("once_per_suite")
def test_distinct_calls_get_distinct_call_ids(cpu_devices):
    """Two calls in one program never meet: each traced call carries a new call_id."""
    mesh = jax.make_mesh((1,), ("x",), devices=cpu_devices[:1])
    a = jax.device_put(jnp.zeros((4, 4), jnp.float64), NamedSharding(mesh, ROWS))

    def local(a):
        pos = jax.lax.axis_index("x")
        inv, s1 = jaxmg_cuda.mg_potri(a, pos, T_A=2, device_ids=[0])
        _, w, s2 = jaxmg_cuda.mg_syevd(inv, pos, T_A=2, device_ids=[0])
        return w, s1, s2

    fn = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=ROWS, out_specs=(P(),) * 3, check_vma=False)
    )
    text = fn.trace(a).lower(lowering_platforms=("cpu",)).as_text()
    ids = [
        line.split("call_id = ")[1].split(" ")[0] for line in text.splitlines() if "call_id" in line
    ]
    assert len(ids) == 2 and ids[0] != ids[1]


@pytest.mark.usefixtures("once_per_suite")
def test_import_loads_no_cuda_library():
    """Importing jaxmg_cuda registers the targets but opens no CUDA library."""
    script = (
        "import jaxmg_cuda, pathlib\n"
        "maps = pathlib.Path('/proc/self/maps').read_text()\n"
        "print('LOADED' if ('libcusolverMg' in maps or 'libcudart' in maps) else 'CLEAN')\n"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "CLEAN", done.stdout + done.stderr


@pytest.mark.usefixtures("once_per_suite")
def test_cuda_libraries_load_or_explain():
    """Opening the libraries on request works, or says what was looked for and where."""
    if not jaxmg_cuda.has_cuda_support():
        pytest.skip("jaxmg_cuda was built without CUDA support")
    message = jaxmg_cuda.load_cuda_libraries()
    assert message == "" or ("libcusolverMg" in message and "LD_LIBRARY_PATH" in message)


@pytest.mark.usefixtures("once_per_suite")
def test_repeated_gpu_probe_reports_instead_of_failing():
    """The probe ``nox -s gpu`` runs: without the CUDA libraries it says why, never raises.
    (With them it reports cuSolverMg's statuses; that path has not yet run on hardware.)"""
    if not jaxmg_cuda.has_cuda_support():
        pytest.skip("jaxmg_cuda was built without CUDA support")
    if jaxmg_cuda.load_cuda_libraries() == "":
        pytest.skip("the CUDA libraries load here: the probe would touch a GPU")
    report = jaxmg_cuda.probe_repeated_gpu(0)
    assert "libcusolverMg" in report and "LD_LIBRARY_PATH" in report, report


@pytest.mark.usefixtures("once_per_suite")
def test_has_cuda_support_reports_the_build():
    assert isinstance(jaxmg_cuda.has_cuda_support(), bool)


# --- the multi-process protocol, seen from one process ----------------------------------------
# Full jobs of 2 and 4 processes run in tests/multiprocess; these cover its error paths with a
# single participant in this process and the peer's pid chosen by the test.


def _dead_pid():
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def _shm_ours():
    return {p for p in os.listdir("/dev/shm") if p.startswith(f"jaxmg-{os.geteuid()}-")}


def _one_of_two(position, pids, job=0x5EED):
    """Mesh position ``position`` of a 2-process potrs, run here on one CPU device."""
    n, tile = 8, 2
    block = to_cyclic(hermitian_pd(n, np.float64), 2, tile).reshape(2, -1, n)[position]
    fn = jax.jit(
        lambda a, b: jaxmg_cuda.mg_potrs(
            a, b, position, T_A=tile, device_ids=[0, 1], job=job, pids=pids
        )
    )
    return jax.block_until_ready(fn(jnp.asarray(block), jnp.ones((1, n))))


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no POSIX shared memory")
@pytest.mark.parametrize("position", [0, 1])
def test_cross_process_peer_that_is_gone(position, monkeypatch):
    """The peer's process does not exist: the call fails at once, naming it, and removes its
    shared memory (the deadline would be 60 s)."""
    monkeypatch.setenv("JAXMG_TIMEOUT_S", "60")
    before = _shm_ours()
    dead = _dead_pid()
    pids = [os.getpid(), dead] if position == 0 else [dead, os.getpid()]
    start = time.monotonic()
    with pytest.raises(
        Exception, match=f"mesh position {1 - position} \\(process {dead}\\).*exited"
    ):
        _one_of_two(position, pids)
    assert time.monotonic() - start < 10
    assert _shm_ours() == before


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no POSIX shared memory")
@pytest.mark.parametrize("position", [0, 1])
def test_cross_process_peer_that_never_comes(position, monkeypatch):
    """The peer's process lives (our parent) but never joins: the deadline names it."""
    monkeypatch.setenv("JAXMG_TIMEOUT_S", "1")
    before = _shm_ours()
    other = os.getppid()
    pids = [os.getpid(), other] if position == 0 else [other, os.getpid()]
    with pytest.raises(Exception, match=f"timed out after 1 s.*mesh position {1 - position}"):
        _one_of_two(position, pids)
    assert _shm_ours() == before


@pytest.mark.usefixtures("once_per_suite")
def test_cross_process_position_of_another_process():
    """A process that claims a mesh position whose pid is not its own is refused."""
    with pytest.raises(Exception, match="belongs to process 1, not to this one"):
        _one_of_two(1, [os.getpid(), 1])
