"""CholeskyQR2 where it is enough, the fallback where it is not
(jaxmg.decompositions.qr._cholesky_qr2_or):
the decision is the first step's ``||Q_1^H Q_1 - I||_F < 1/2``, so a matrix with condition
number well below ``ε^{-1/2}`` is factored by CholeskyQR2 (orthonormal to ``O(ε)``, ``QR = A``
against numpy), and one far above it, or with dependent columns, goes to the fallback."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxmg.decompositions import qr as _qr
from jaxmg.decompositions.glue import _where

# The ring products' device count is the decomposition tests' business (they run both branches
# at every count); the decision itself runs once.
pytestmark = pytest.mark.usefixtures("once_per_suite")

EPS = float(np.finfo(np.float64).eps)
FALLBACK = 77  # the status the stand-in fallback returns: it says which branch ran


def conditioned(n, cond, seed=0):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (u * np.logspace(0, -np.log10(cond), n)) @ v.T


def factor(a, form):
    d = jax.device_count()
    spec = P("x", None) if form == "rows" else P(None, "x")
    sharded = jax.device_put(a, NamedSharding(jax.make_mesh((d,), ("x",)), spec))
    geometry, _ = _where(sharded, None, None, None, "test")

    def fallback(x):
        return jnp.zeros_like(x), jnp.zeros_like(x), jnp.asarray(FALLBACK, jnp.int32)

    program = jax.jit(lambda a: _qr._cholesky_qr2_or(geometry, a, fallback, with_r=True))
    return (np.asarray(x) for x in program(sharded)[:3])


@pytest.mark.parametrize("form", ["rows", "cols"])
@pytest.mark.parametrize("cond", [1.0, 1e3, 1e6])
def test_well_conditioned_is_cholesky_qr2(form, cond):
    n = 8 * jax.device_count()
    a = conditioned(n, cond)
    q, r, status = factor(a, form)
    assert int(status) == 0
    assert np.abs(q.T @ q - np.eye(n)).max() < 50 * EPS
    assert np.linalg.norm(q @ r - a) / np.linalg.norm(a) < 50 * EPS
    assert np.allclose(np.tril(r, -1), 0)
    np.testing.assert_allclose(np.abs(np.diag(r)), np.abs(np.diag(np.linalg.qr(a)[1])), rtol=1e-6)


@pytest.mark.parametrize("form", ["rows", "cols"])
def test_ill_conditioned_or_dependent_goes_to_the_fallback(form):
    n = 8 * jax.device_count()
    dependent = conditioned(n, 10.0)
    dependent[:, 1] = dependent[:, 0]
    for a in (conditioned(n, 1e12), dependent):
        assert int(list(factor(a, form))[2]) == FALLBACK
