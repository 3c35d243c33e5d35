"""The solver suite on NVIDIA GPUs through cuSolverMg.

NOT YET RUN ON HARDWARE: no GPU was available while this was written. Without a GPU these tests
skip; ``JAXMG_REQUIRE_GPU=1`` (set by ``nox -s gpu``) turns the skip into a failure.
"""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxmg

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
FORMS = {"cols": P(None, "x"), "rows": P("x", None)}


def hpd(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        m = m + 1j * rng.standard_normal((n, n))
    return (m @ m.conj().T / n + np.eye(n)).astype(dtype)


def scaled(value, n, dtype):
    return value / (n * np.finfo(dtype).eps)


@pytest.fixture
def gpu_mesh(gpu_devices):
    return jax.make_mesh((len(gpu_devices),), ("x",), devices=gpu_devices)


@pytest.mark.gpu
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_potrs(gpu_mesh, form, dtype):
    n = 256 * gpu_mesh.size
    a_host = hpd(n, dtype)
    b_host = np.random.default_rng(1).standard_normal((n, 3)).astype(dtype)
    a = jax.device_put(a_host, NamedSharding(gpu_mesh, FORMS[form]))
    x, status = jaxmg.potrs(a, jax.numpy.asarray(b_host), 64, return_status=True)
    assert int(status) == 0
    x = np.asarray(x)
    r = np.linalg.norm(a_host @ x - b_host) / (np.linalg.norm(a_host, 1) * np.linalg.norm(x))
    assert scaled(r, n, dtype) < 30


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_potri(gpu_mesh, dtype):
    n = 256 * gpu_mesh.size
    a_host = hpd(n, dtype, seed=2)
    inv, status = jaxmg.potri(
        jax.device_put(a_host, NamedSharding(gpu_mesh, P(None, "x"))), 64, return_status=True
    )
    assert int(status) == 0
    x = np.asarray(inv)
    r = np.linalg.norm(a_host @ x - np.eye(n)) / (np.linalg.norm(a_host, 1) * np.linalg.norm(x, 1))
    assert scaled(r, n, dtype) < 30


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_syevd(gpu_mesh, dtype):
    n = 256 * gpu_mesh.size
    rng = np.random.default_rng(3)
    m = rng.standard_normal((n, n)).astype(dtype)
    a_host = (m + m.conj().T) / 2
    w, v, status = jaxmg.syevd(
        jax.device_put(a_host, NamedSharding(gpu_mesh, P(None, "x"))), 64, return_status=True
    )
    assert int(status) == 0
    w, v = np.asarray(w), np.asarray(v)
    norm_a = np.linalg.norm(a_host, 2)
    assert scaled(np.max(np.abs(w - np.linalg.eigvalsh(a_host))) / norm_a, n, dtype) < 30
    assert scaled(np.linalg.norm(v.conj().T @ v - np.eye(n), 1), n, dtype) < 30


@pytest.mark.gpu
def test_gpu_not_positive_definite(gpu_mesh):
    n = 128 * gpu_mesh.size
    a_host = hpd(n, np.float64)
    a_host[10, 10] = -1e3
    x, status = jaxmg.potrs(
        jax.device_put(a_host, NamedSharding(gpu_mesh, P(None, "x"))),
        jax.numpy.ones((n, 1), jax.numpy.float64),
        64,
        return_status=True,
    )
    assert int(status) != 0
    assert np.isnan(np.asarray(x)).all()


@pytest.mark.gpu
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_lu_solve(gpu_mesh, form, dtype):
    n = 256 * gpu_mesh.size
    rng = np.random.default_rng(4)
    a_host = (rng.standard_normal((n, n)) / np.sqrt(n) + 3 * np.eye(n)).astype(dtype)
    b_host = rng.standard_normal((n, 2)).astype(dtype)
    factor = jaxmg.lu_factor(jax.device_put(a_host, NamedSharding(gpu_mesh, FORMS[form])), 64)
    assert int(factor.status) == 0
    for trans, op in ((0, a_host), (1, a_host.T), (2, a_host.conj().T)):
        x = np.asarray(jaxmg.lu_solve(factor, jax.numpy.asarray(b_host), trans=trans))
        r = np.linalg.norm(op @ x - b_host) / (np.linalg.norm(op, 1) * np.linalg.norm(x))
        assert scaled(r, n, dtype) < 30, trans


@pytest.mark.gpu
@pytest.mark.parametrize("form", FORMS)
def test_gpu_factor_reuse_and_gradient(gpu_mesh, form):
    """cho_factor/cho_solve/logdet and the gradient of potrs with logdet, against JAX on one
    GPU: the backward pass's factored solve and inverse on cuSolverMg."""
    n = 256 * gpu_mesh.size
    a_host = hpd(n, np.float64, seed=5)
    b_host = np.random.default_rng(6).standard_normal(n)
    a = jax.device_put(a_host, NamedSharding(gpu_mesh, FORMS[form]))
    factor = jaxmg.cho_factor(a, 64)
    np.testing.assert_allclose(
        np.asarray(jaxmg.cho_solve(factor, jax.numpy.asarray(b_host))),
        np.linalg.solve(a_host, b_host),
        rtol=1e-9,
    )
    np.testing.assert_allclose(float(factor.logdet), np.linalg.slogdet(a_host)[1], rtol=1e-12)

    def nll(s):
        x, logdet = jaxmg.potrs(s, jax.numpy.asarray(b_host), 64, return_logdet=True)
        return 0.5 * jax.numpy.dot(jax.numpy.asarray(b_host), x) + 0.5 * logdet

    grad = np.asarray(jax.jit(jax.grad(nll))(a))
    inverse = np.linalg.inv(a_host)
    x = inverse @ b_host
    expected = 0.5 * inverse - 0.5 * np.outer(x, x)  # symmetric: the Hermitian gradient
    np.testing.assert_allclose(grad, expected, atol=1e-9 * np.abs(expected).max())
