"""Faults and limits (issue 15): meeting identity, shared-memory exhaustion, 32-bit limits and
illegal-argument reporting.

Results are checked against numpy; deadlines are generous (JAXMG_TIMEOUT_S), and no assertion
depends on how long anything took.
"""

import os
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

import jaxmg
import jaxmg_cuda


def hermitian_pd(n, seed):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    return m @ m.T / n + np.eye(n)


def run_script(body, ndev, env, timeout=300):
    """``body`` in a fresh Python process with ``ndev`` CPU devices; returns its stdout."""
    script = (
        "import jax\njax.config.update('jax_enable_x64', True)\n"
        f"jax.config.update('jax_num_cpu_devices', {ndev})\n" + body
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


# --- 1. meeting identity ------------------------------------------------------------------

LATE_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    import jaxmg

    devices = jax.devices()
    mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)
    n = 8 * len(devices)

    def matrix(seed):
        m = np.random.default_rng(seed).standard_normal((n, n))
        return m @ m.T / n + np.eye(n)

    solve = jax.jit(lambda a, b: jaxmg.potrs(a, b, T_A=2, mesh=mesh, in_specs=P(None, "x")))
    b = np.arange(1.0, n + 1)[:, None]
    # Dispatched back to back: while the first call's late participant is still asleep, the
    # others have given up on it and already wait in the second call.
    matrices = [matrix(seed) for seed in range(3)]
    placed = [jax.device_put(A, NamedSharding(mesh, P(None, "x"))) for A in matrices]
    pending = [solve(a, b) for a in placed]
    for k, (A, x) in enumerate(zip(matrices, pending)):
        try:
            x = np.asarray(x)
        except Exception as err:  # every shard failed: fine, never a mix
            print("CALL", k, "ERROR", "timed out" in str(err))
            continue
        residual = np.linalg.norm(A @ x - b) / (np.linalg.norm(A) * np.linalg.norm(x) * n)
        print("CALL", k, "OK", residual < 30 * np.finfo(np.float64).eps)
    x = np.asarray(solve(placed[0], b))  # and the next call works
    print("AFTER", np.allclose(matrices[0] @ x, b))
    """
)


def test_late_participant_never_meets_the_next_call(cpu_devices):
    """A participant that arrives after the others timed out fails on its own; the calls
    dispatched after it each come out wholly right or wholly an error, never a mix of data.

    (XLA:CPU in jax 0.10 starts an execution of these programs only once the one before has
    finished, so on CPU the late participant cannot meet the next call whatever the meeting's
    identity; GPUs run executions concurrently. The test pins the outcome either way.)"""
    ndev = len(cpu_devices)
    if ndev < 2:
        pytest.skip("needs at least 2 devices")
    env = {"JAXMG_TIMEOUT_S": "2", "JAXMG_TEST_DELAY": f"{ndev - 1}:3:1"}
    out = run_script(LATE_SCRIPT, ndev, env)
    lines = [line for line in out.splitlines() if line.startswith(("CALL", "AFTER"))]
    assert len(lines) == 4, out
    assert lines[0] == "CALL 0 ERROR True", out  # the late one's own call times out
    for line in lines[1:3]:
        assert line.endswith(("OK True", "ERROR True")), out
    assert lines[3] == "AFTER True", out


def test_disjoint_submeshes_run_concurrently(cpu_devices, monkeypatch):
    """Two programs on disjoint halves of the devices, Explicit axes under jit (their device ids
    are unknown at trace time and both lower to the same call key), from two threads at once:
    every result is right. Position 0 arrives late in every call, so that the other positions
    of both programs would wait side by side under that key if the executions overlapped
    (XLA:CPU in jax 0.10 runs them one after another; GPUs do not)."""
    if len(cpu_devices) < 4:
        pytest.skip("needs at least 4 devices")
    monkeypatch.setenv("JAXMG_TEST_DELAY", "0:0.05")
    monkeypatch.setenv("JAXMG_TIMEOUT_S", "120")
    half = len(cpu_devices) // 2
    n = 4 * half
    errors = []
    solve = jax.jit(lambda a, b: jaxmg.potrs(a, b, T_A=2))  # one trace serves both meshes
    ready = threading.Barrier(2)

    def worker(devices, seed):
        mesh = Mesh(np.array(devices), ("x",), axis_types=(AxisType.Explicit,))
        problems = []
        ready.wait()  # both start together
        for i in range(20):
            A = hermitian_pd(n, seed + i)
            b = np.arange(1.0, n + 1)[:, None] * (seed + i)
            a = jax.device_put(A, NamedSharding(mesh, P(None, "x")))
            problems.append((A, b, solve(a, jax.device_put(b, NamedSharding(mesh, P())))))
        for i, (A, b, x) in enumerate(problems):  # dispatched first, so that the calls overlap
            try:
                x = np.asarray(x)
            except Exception as err:
                errors.append((seed, i, str(err)[:200]))
                continue
            if not np.allclose(x, np.linalg.solve(A, b), rtol=1e-8, atol=1e-10):
                errors.append((seed, i, "wrong"))

    threads = [
        threading.Thread(target=worker, args=(cpu_devices[:half], 1)),
        threading.Thread(target=worker, args=(cpu_devices[half : 2 * half], 1000)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# --- 3. 64-bit sizes ----------------------------------------------------------------------


def test_library_sizes_are_checked_one_by_one(once_per_suite):
    """N, L, T_A and nrhs each must fit the library's int; their product need not (B is N x
    nrhs with leading dimension N): N = 131072 with nrhs = 16384 (N * nrhs = 2^31) is fine."""
    check = jaxmg_cuda._jaxmg_cuda.check_library_sizes
    assert check(n=131072, local=32768, tile=256, nrhs=16384) == ""
    assert check(n=2**31 - 1, local=2**31 - 1, tile=2**31 - 1, nrhs=2**31 - 1) == ""
    for name, sizes in [
        ("N", dict(n=2**31, local=1, tile=1, nrhs=1)),
        ("the local width L", dict(n=1, local=2**31, tile=1, nrhs=1)),
        ("T_A", dict(n=1, local=1, tile=2**31, nrhs=1)),
        ("nrhs", dict(n=131072, local=1, tile=1, nrhs=2**31)),
    ]:
        message = check(**sizes)
        assert message.startswith(f"{name}=2147483648 does not fit"), message
        assert "at most 2147483647" in message


# --- 4. an illegal argument is an error, on every device ------------------------------------


@pytest.mark.parametrize("routine, message", [("potrs", "dpotrf"), ("syevd", "dsyevd")])
def test_illegal_argument_is_an_error(cpu_devices, monkeypatch, routine, message):
    """LAPACK's info < 0 (provoked with an illegal leading dimension) is jaxmg's bug, not the
    user's data: an error naming the routine and the argument, never a status."""
    ndev = len(cpu_devices)
    mesh = jax.make_mesh((ndev,), ("x",), devices=cpu_devices)
    n = 4 * ndev
    A = jax.device_put(hermitian_pd(n, 0), NamedSharding(mesh, P(None, "x")))
    monkeypatch.setenv("JAXMG_TEST_ILLEGAL_LDA", "1")
    argument = {"potrs": 4, "syevd": 5}[routine]  # lda's place in ?potrf / ?syevd
    native = dict(T_A=2, return_status=True, backend="mg")  # one device too: the native engine
    with pytest.raises(Exception, match=f"{message} rejected argument {argument} as illegal"):
        if routine == "potrs":
            jax.block_until_ready(jaxmg.potrs(A, jnp.ones((n, 1)), **native))
        else:
            jax.block_until_ready(jaxmg.syevd(A, **native))
    monkeypatch.delenv("JAXMG_TEST_ILLEGAL_LDA")
    x, status = jaxmg.potrs(A, jnp.ones((n, 1)), **native)  # the next works
    assert int(status) == 0
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(hermitian_pd(n, 0), np.ones((n, 1))))
