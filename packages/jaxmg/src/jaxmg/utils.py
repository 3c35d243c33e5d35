"""Helpers that jaxmg 0.0.x exposed as ``jaxmg.utils`` and its users' tests import.

``random_psd`` builds the test matrices of jaxmg 0.0.x's own tests; ``JaxMgWarning`` is the
category of every warning jaxmg issues. jaxmg 0.0.x's other helpers here (the distributed-setup
probe run at import, mesh and dtype lookups) were internal and are not provided.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp

__all__ = ["JaxMgWarning", "random_psd"]


class JaxMgWarning(UserWarning):
    """The category of the warnings jaxmg issues (a ``UserWarning``, so filters on
    ``UserWarning`` catch them too); filter on it to silence or raise only jaxmg's."""


def random_psd(n: int, dtype, seed: int) -> jax.Array:
    """A random ``n x n`` Hermitian positive definite matrix, as jaxmg 0.0.x built them.

    ``G G^H + 1e-5 I`` with ``G`` an ``n x n`` draw of ``jax.random.normal`` (key
    ``jax.random.key(seed)``, dtype ``dtype``; complex dtypes draw complex normals) divided by
    ``sqrt(n)``: 0.0.x's construction, the same draw for the same arguments. Its eigenvalues
    are at least ``1e-5`` up to rounding, so a double-precision Cholesky factorization
    succeeds; in single precision a large ``n`` may be numerically indefinite. The result is
    an unsharded array of ``dtype`` on the default device (``float64`` needs
    ``jax_enable_x64``).

    Raises:
        TypeError, ValueError: ``n`` not a positive int.
    """
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"random_psd: n must be a positive int, got {n!r}.")
    if n <= 0:
        raise ValueError(f"random_psd: n must be a positive int, got {n}.")
    g = jax.random.normal(jax.random.key(seed), (n, n), dtype=dtype) / math.sqrt(n)
    return g @ g.T.conj() + jnp.eye(n, dtype=g.dtype) * 1e-5
