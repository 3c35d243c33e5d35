"""QDWH's weights (jaxmg.decompositions.qdwh.weights) against the property that defines them
(Nakatsukasa, Bai, Gygi 2010): each step's rational map ``f(x) = x (a + b x^2) / (1 + c x^2)``
takes every singular value in ``[l, 1]`` into ``[l', 1]`` with ``l' = f(l)``, so that after the
last step every singular value above ``eps`` is 1 to within ``10 eps``."""

import functools

import numpy as np
import pytest

from jaxmg.decompositions.qdwh import weights


@pytest.mark.parametrize(("dtype", "steps", "qr_steps"), [(np.float64, 6, 2), (np.float32, 4, 2)])
def test_weights_take_every_singular_value_to_one(dtype, steps, qr_steps):
    eps = float(np.finfo(dtype).eps)
    sequence = weights(eps)
    assert len(sequence) == steps
    assert sum(c > 100 for _, _, c in sequence) == qr_steps  # the QR-based ones come first
    assert all(c > 100 for _, _, c in sequence[:qr_steps])
    x = np.geomspace(eps, 1, 20001)  # the singular values of X_0 = A / ||A||_F, in [eps, 1]
    low = eps
    for a, b, c in sequence:
        x = x * (a + b * x**2) / (1 + c * x**2)
        low = low * (a + b * low**2) / (1 + c * low**2)
        assert x.min() >= low * (1 - 1e-12) and x.max() <= 1 + 1e-12
    assert np.abs(x - 1).max() < 10 * eps


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.parametrize("form", ["rows", "cols"])
def test_cholesky_step_by_inverse_and_by_solves(form):
    """The Cholesky-based step ``(b / c) X + (a - b / c) X (I + c X^H X)^{-1}`` through
    ``potri`` (the default) and through two triangular solves (backend "mp" on GPUs, which has
    no inverse) against numpy's, for the last step's weights (``c`` about 3)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from jaxmg.decompositions import qdwh as _qdwh
    from jaxmg.decompositions.glue import _where

    d = jax.device_count()
    n = 4 * d
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, n))
    x /= np.linalg.norm(x, 2)  # a late iterate: singular values in (0, 1]
    a, b, c = weights(float(np.finfo(np.float64).eps))[-1]
    expected = (b / c) * x + (a - b / c) * x @ np.linalg.inv(np.eye(n) + c * x.T @ x)

    spec = P("x", None) if form == "rows" else P(None, "x")
    mesh = jax.make_mesh((d,), ("x",))
    sharded = jax.device_put(x, NamedSharding(mesh, spec))
    geometry, _ = _where(sharded, None, None, None, "test")
    for inverse in (True, False):
        step = functools.partial(_qdwh._cholesky_step, geometry, a=a, b=b, c=c, inverse=inverse)
        got, status = jax.jit(step)(sharded)
        assert int(status) == 0
        assert np.abs(np.asarray(got) - expected).max() < 100 * np.finfo(np.float64).eps
