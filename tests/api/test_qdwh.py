"""QDWH's weights (jaxmg._qdwh.weights) against the property that defines them (Nakatsukasa,
Bai, Gygi 2010): each step's rational map ``f(x) = x (a + b x^2) / (1 + c x^2)`` takes every
singular value in ``[l, 1]`` into ``[l', 1]`` with ``l' = f(l)``, so that after the last step
every singular value above ``eps`` is 1 to within ``10 eps``."""

import numpy as np
import pytest

from jaxmg._qdwh import weights


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
