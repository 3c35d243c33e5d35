"""QR of a sharded matrix by CholeskyQR2 (Yamamoto, Nakatsukasa, Yanagisawa, Fukaya 2015)
where it is enough, else by shifted CholeskyQR (Fukaya, Kannan, Nakatsukasa, Yamamoto,
Yanagisawa 2020).

CholeskyQR2 is two CholeskyQR steps (``cho_factor`` of the Gram matrix ``X^H X``, then ``X
R^{-1}``); its first step's ``Q_1`` says whether the second finishes the job
(:func:`_cholesky_qr2_or`). Otherwise two Cholesky factorisations of shifted Gram matrices
``X^H X + s I`` make ``Q_2`` well enough conditioned for two plain CholeskyQR steps to finish.
Each ``X R^{-1}`` is a blocked triangular solve with the sharded ``R`` (no ``N x N`` matrix
whole on a device). Full column rank ``A`` with ``cond(A)`` up to about 1e14 in float64
(tested at N = 1024); beyond, a Cholesky factorisation fails, and the status says which.
Derivatives: JAX's rule for ``jnp.linalg.qr`` (``M >= N``; for ``M < N`` through the product
``Q^H A``), ``dA R^{-1}`` as a ``custom_linear_solve`` so that reverse mode can transpose it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxmg_layout

from ..describe.sharding import _placed
from ..solvers import factors
from . import products
from .engine_routines import (
    _qr_native,
)
from .glue import (
    _engine,
    _engine_qr,
    _finite_status,
    _glue,
    _h,
    _like_a,
    _mm,
    _positive_diagonal,
    _qr_tangents,
    _whole,
)


def _upper_factor(f, form):
    """``R`` with ``G = R^H R`` from a Cholesky factor's rows in ``A``'s order
    (:func:`cholesky_upper`): ``L^T`` by columns, ``R`` itself by rows (the factor of
    ``conj(G)``); the other triangle holds what the engine did not write."""
    r = jnp.triu(f)
    return jnp.conj(r) if form == "cols" else r


def cholesky_upper(geometry, g):
    """``(R, status)``: ``R`` upper triangular with ``R^H R = G``, sharded like ``G``, from the
    engine's ``cho_factor`` with the widest tile whose factor is triangular in ``G``'s order
    (:meth:`jaxmg.engines.base.Engine.triangular_tile`). A factor in tiles narrower than a
    device's block comes back to the blocks first (``undo_cyclic_1d_layout``)."""
    n, ndev, spec = g.shape[0], geometry.ndev, geometry.spec
    tile = geometry.engine.triangular_tile(n, ndev)
    factor = factors.cho_factor(
        g, T_A=tile, mesh=geometry.mesh, in_specs=spec, backend=_engine(geometry)
    )
    rows = factor.factor
    if tile < n // ndev:
        stored = NamedSharding(geometry.mesh, P(geometry.axis, None))
        rows = jaxmg_layout.undo_cyclic_1d_layout(rows, tile, n, sharding=stored)
    upper = functools.partial(_upper_factor, form=geometry.form)
    return _glue(geometry, spec, upper, rows), factor.status


def _frobenius2(a):
    """``||A||_F^2`` without flattening ``A`` (a reshape of a column-sharded ``A`` gathers it)."""
    return jnp.sum(jnp.real(a) ** 2 + jnp.imag(a) ** 2)


def _gram(a, geometry):
    """``A^H A``, sharded like ``A``'s square matrices."""
    spec = geometry.spec
    if _like_a(geometry, a.shape) == spec:  # a ring product: no whole N x N per device
        return products.gram(a, a, geometry.mesh, spec)
    return _glue(geometry, spec, lambda a: _mm(_h(a), a), a)


def _cholesky_qr(a, geometry, shift, g=None):
    """``Q = A R^{-1}``, ``R`` and the factorisation's status, ``R^H R = A^H A + shift I``
    (``g``: ``A^H A`` when it is known already)."""
    n = a.shape[1]
    spec = geometry.spec
    g = _gram(a, geometry) if g is None else g
    if shift is not None:
        g = _glue(geometry, spec, lambda g, s: g + s * jnp.eye(n, dtype=g.dtype), g, shift)
    r, status = cholesky_upper(geometry, g)
    return _right_solve(a, r, geometry), r, status


def _right_solve(x, r, geometry, lower=False):
    """``X R^{-1}`` for a triangular ``R`` (upper, or ``lower``), both sharded like ``A``: a blocked
    triangular solve (backward stable, as LAPACK's trsm) that moves one block at a time
    (:func:`jaxmg.decompositions.products.right_triangular_solve`); ``X`` comes back sharded like
    ``A``."""
    return products.right_triangular_solve(x, r, geometry.mesh, geometry.spec, lower)


def _right_solve_linear(x, r, geometry):
    """``X R^{-1}`` as a linear map of ``X`` that reverse mode can transpose: the solver's
    calls are no JAX primitives, so its transpose ``Y R^{-T}`` is given explicitly."""
    spec = geometry.spec
    rt = _glue(geometry, spec, jnp.transpose, r)
    return jax.lax.custom_linear_solve(
        lambda y: _glue(geometry, _like_a(geometry, y.shape), _mm, y, r),
        x,
        solve=lambda _, b: _right_solve(b, r, geometry),
        transpose_solve=lambda _, b: _right_solve(b, rt, geometry, lower=True),
    )


def _first_failed(statuses):
    status = jnp.asarray(0, jnp.int32)
    for st in reversed(statuses):
        status = jnp.where(st != 0, st, status)
    return status


def _steps(geometry, a, shifted, with_r, g=None):
    """CholeskyQR steps on ``a``, shifted where ``shifted`` says: ``(Q, R or None, status)``,
    ``R = R_k ... R_1`` (each product as it comes, a ring product), the status the first
    failed step's; ``g``: ``A^H A`` when it is known already."""
    m, n = a.shape
    eps = float(np.finfo(a.dtype).eps)

    def shift(x):  # Fukaya et al.'s: 11 (M N + N (N + 1)) ε ||X||_F^2
        return (11 * (m * n + n * (n + 1)) * eps * _frobenius2(x)).astype(x.dtype)

    q, r, statuses = a, None, []
    for step_shifted in shifted:
        s = _glue(geometry, P(), shift, q) if step_shifted else None
        q, r_k, st = _cholesky_qr(q, geometry, s, g)
        g = None
        if with_r:
            r = r_k if r is None else products.times(r_k, r, geometry.mesh, geometry.spec)
        statuses.append(st)
    return q, r, _first_failed(statuses)


def _distance2_from_identity(g):
    return _frobenius2(g - jnp.eye(g.shape[0], dtype=g.dtype))


def _cholesky_qr2_or(geometry, a, fallback, with_r):
    """``(Q, R or None, status, plain)`` of ``a`` by CholeskyQR2 when that is enough (``plain``
    true), else ``fallback(a)``.

    CholeskyQR2 (Yamamoto, Nakatsukasa, Yanagisawa, Fukaya 2015) is backward stable and
    orthonormal to ``O(ε)`` while ``cond(A)`` is below about ``ε^{-1/2}``. The Gram matrix
    ``G_2 = Q_1^H Q_1`` of its first step's ``Q_1`` says whether it is: ``||G_2 - I||_F <
    1/2`` bounds ``cond(Q_1)`` by ``sqrt(3)``, and one more CholeskyQR step leaves ``Q``
    orthonormal to ``O(ε)``; otherwise (the first Cholesky factorisation failed, or ``Q_1`` is
    far from orthonormal, as with dependent columns) ``fallback`` runs. Only the branch taken
    runs (``lax.cond``), and its only operand is ``a``: every operand of a branch stays live
    until the branch ends, so the deciding step's results are not kept (CholeskyQR2's branch
    computes its first step again)."""
    q1, _, st1 = _cholesky_qr(a, geometry, None)
    near = _glue(geometry, P(), _distance2_from_identity, _gram(q1, geometry)) < 0.25  # NaN: no

    def twice(a):
        return _steps(geometry, a, (False, False), with_r)

    plain = (st1 == 0) & near
    return (*lax.cond(plain, twice, fallback, a), plain)


def orthonormal_factor(geometry, a, shifted, g=None):
    """``(Q, status)`` of ``a`` without ``R`` by the CholeskyQR steps ``shifted`` (CholeskyQR2:
    ``(False, False)``; shifted CholeskyQR3: ``(True, False, False)``); ``g``: ``A^H A`` when
    it is known already; the status is the first failed step's."""
    q, _, status = _steps(geometry, a, shifted, False, g)
    return q, status


@functools.partial(jax.jit, static_argnums=0)
def _qr_program(geometry, a):
    """``(Q, R, status)`` of ``a`` (``M >= N``): CholeskyQR2 where it is enough, else two
    shifted CholeskyQR steps and two plain ones (shifted CholeskyQR3 with one more shifted
    step, for the largest ``N``)."""
    n = a.shape[1]

    def shifted(a):
        return _steps(geometry, a, (True, True, False, False), with_r=True)

    def distance(q):
        return products.distance_from_orthonormal(q, geometry.mesh, geometry.spec)

    q, r, status, plain = _cholesky_qr2_or(geometry, a, shifted, with_r=True)
    # Dependent columns need not make a shifted factorisation fail (the shift keeps the first
    # Gram matrix positive definite): Q's columns then are not orthonormal, and the status says
    # so. (On CholeskyQR2's branch its test of G_2 has excluded them.) Checked after the
    # branches: inside the shifted one, Q^H Q was made beside a copy of Q and R (1.25 blocks).
    lost = lax.cond(plain, lambda q: jnp.zeros((), jnp.real(q).dtype), distance, q)
    status = jnp.where((status == 0) & ~(lost < _DEPENDENT), n + 1, status)
    nan = jnp.asarray(jnp.nan, a.dtype)

    def final(q, r, status):  # one glue: apart, XLA kept a copy of R between them
        return jnp.where(status == 0, q, nan), jnp.where(status == 0, jnp.triu(r), nan)

    q, r = _glue(geometry, (geometry.spec, geometry.spec), final, q, r, status)
    return q, r, status


#: ``max |Q^H Q - I|`` beyond which the columns count as dependent (shifted CholeskyQR reaches
#: ``O(ε)`` for condition numbers up to about ``1 / ε``; a dependent column leaves ``O(1)``).
_DEPENDENT = 0.1


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _qr(geometry, a):
    return _qr_program(geometry, a)


@_qr.defjvp
def _qr_jvp(geometry, primals, tangents):
    """:func:`_qr_tangents` with ``dA R^{-1}`` from LU solves with ``R^H``."""
    (a,), (da,) = primals, tangents
    q, r, status = _qr(geometry, a)
    da_rinv = _right_solve_linear(da, r, geometry)

    specs = (_like_a(geometry, q.shape), _like_a(geometry, r.shape))
    dq, dr = _glue(geometry, specs, _qr_tangents, q, r, da_rinv)
    return (q, r, status), (dq, dr, np.zeros(status.shape, jax.dtypes.float0))


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _qr_call(geometry, mode, T_A, a):
    m, n = a.shape
    if geometry.engine.whole:
        a = _whole(a, geometry)
        q, r = _positive_diagonal(*jnp.linalg.qr(a))  # as the other paths give R
        status, q, r = _finite_status(a, q, r)
        q = _placed(q, geometry.mesh, _like_a(geometry, q.shape))
        r = _placed(r, geometry.mesh, _like_a(geometry, r.shape))
        return (None if mode == "r" else q), r, status
    if _engine_qr(geometry):
        q, r, status = _qr_native(geometry, T_A, a)
    elif m >= n:
        q, r, status = _qr(geometry, a)
    else:  # the first M columns' QR, and Q^H times the others
        first = _glue(geometry, _like_a(geometry, (m, m)), lambda a: a[:, :m], a)
        q, r1, status = _qr(geometry, first)
        r = _glue(
            geometry,
            _like_a(geometry, (m, n)),
            lambda q, r1, a: jnp.concatenate([r1, _mm(_h(q), a[:, m:])], axis=1),
            q,
            r1,
            a,
        )
    return (None if mode == "r" else q), r, status
