"""The SVD of a sharded matrix, and ``polar`` and ``lstsq`` from it: by QDWH's polar decomposition
and ``syevd`` of its Hermitian factor (:mod:`jaxmg.decompositions.qdwh`) for ``M >= N`` with ``N``
divisible by the devices and reduced factors; otherwise (``M < N``, such an ``N``, or
``full_matrices=True``) as the Hermitian eigenproblem of the Jordan-Wielandt matrix ``B = [[0, A],
[A^H, 0]]`` (``syevd`` of ``M + N`` columns).

``B``'s eigenvalues are ``±σ_i`` (and ``|M - N|`` zeros), the eigenvector of ``+σ_i`` is ``(u_i;
v_i) / sqrt(2)``. ``syevd`` is backward stable, so the singular values carry LAPACK's absolute error
(``O(ε ||A||)``) whatever the condition number, and each singular vector the error of its gap, as
``gesvd``'s; a Newton-Schulz step in ring products (:mod:`jaxmg.decompositions.products`) polishes
the vectors. The price: ``8x`` the eigensolver's work of an ``N x N`` problem, and a matrix of ``(M
+ N)^2`` elements. ``polar``: on the QDWH route (``side="right"``) QDWH's own factors, without the
eigensolver; otherwise ``U = U_s Vh``, ``H = V diag(s) Vh``; ``lstsq``: the pseudo-inverse, singular
values below ``rcond * s[0]`` dropped (``jnp.linalg.lstsq``'s rule). Derivatives: JAX's rule for
distinct singular values (``full_matrices=False``), written with sharded products, whichever route
made the SVD; ``polar`` and ``lstsq`` differentiate through it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from ..describe.sharding import _placed
from ..solvers import hermitian
from . import products, qdwh, qr as qr_module
from .engine_routines import (
    _svd_native,
)
from .glue import (
    _REPLICATED,
    _engine,
    _finite_status,
    _glue,
    _h,
    _like_a,
    _mm,
    _native_mp,
    _svd_specs,
    _transposed,
    _whole,
)


def _jordan_wielandt(a, pad):
    """``B = [[0, A], [A^H, 0]]``, padded with ``pad`` rows and columns whose diagonal lies
    below ``-2 ||A||_F``, so that their eigenvectors (unit vectors) come first and never mix
    with ``A``'s."""
    m, n = a.shape
    top = jnp.concatenate([jnp.zeros((m, m), a.dtype), a], axis=1)
    bottom = jnp.concatenate([_h(a), jnp.zeros((n, n), a.dtype)], axis=1)
    b = jnp.concatenate([top, bottom], axis=0)
    if pad:
        norm = jnp.linalg.norm(a)
        below = -jnp.where(norm > 0, 2 * norm, 1).astype(a.dtype)
        diagonal = jnp.concatenate([jnp.zeros(m + n, a.dtype), jnp.full(pad, below)])
        b = jnp.pad(b, ((0, pad), (0, pad))) + jnp.diag(diagonal)
    return b


def _singular_pairs(w, v, *, m, n, pad):
    """``U``, ``s``, ``V`` (columns scaled to unit norm) and which singular values determine
    their vectors, from the eigenpairs of the Jordan-Wielandt matrix, ascending: the
    padding's, ``-σ`` (``K`` of them), ``|M - N|`` zeros, ``+σ`` (``K``).

    An eigenvector of ``+σ`` that the eigensolver mixed with the one of ``-σ`` (a gap of
    ``2σ``, tiny for a small ``σ``) still has its ``u`` and ``v`` halves parallel to the true
    ones, only not of norm ``1/sqrt(2)``: the scaling undoes that. Singular values at rounding
    level of ``s[0]`` (a rank-deficient ``A``) determine nothing: their vectors are any of a
    null space the eigensolver mixes freely."""
    k = min(m, n)
    positive = v[:, pad + m + n - k :][:, ::-1]
    s = jnp.maximum(w[pad + m + n - k :][::-1], 0)
    u, vv = positive[:m], positive[m : m + n]
    determined = s > max(m, n) * jnp.finfo(s.dtype).eps * s[0]
    return _unit_columns(u), s, _unit_columns(vv), determined


def _unit_columns(x):
    norms = jnp.linalg.norm(x, axis=0, keepdims=True)
    return x / jnp.where(norms > 0, norms, 1).astype(x.dtype)


def _polished(x, determined, geometry, spec):
    """Two Newton-Schulz steps on the ``determined`` columns of ``x``: mixing of an eigenvector with
    other pairs' leaves ``X^H X`` off the identity by ``O(ε ||A|| / gap)``, which each step squares.
    The other columns take no part, so that they cannot spoil the determined ones. Sharded ``x``:
    ring products (:mod:`jaxmg.decompositions.products`); replicated: XLA's."""
    if spec != _REPLICATED:
        return products.newton_schulz(x, determined, geometry.mesh, spec)

    def steps(x, keep):
        kept = jnp.where(keep[None, :], x, 0)
        eye = jnp.eye(x.shape[1], dtype=x.dtype)
        for _ in range(2):
            kept = kept + _mm(kept, eye - _mm(_h(kept), kept)) / 2
        return jnp.where(keep[None, :], kept, x)

    return _glue(geometry, _REPLICATED, steps, x, determined)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _svd_program(geometry, T_A, full, a):
    """``(U, s, Vh, status)`` of ``a`` (``full``: ``U`` is ``M x M`` and ``Vh`` ``N x N``)."""
    m, n = a.shape
    k = min(m, n)
    pad = -(m + n) % geometry.ndev
    b = _glue(geometry, geometry.spec, functools.partial(_jordan_wielandt, pad=pad), a)
    w, v, status = hermitian.syevd(
        b,
        T_A=T_A,
        mesh=geometry.mesh,
        in_specs=geometry.spec,
        return_status=True,
        backend=_engine(geometry),
    )
    u_spec, _, vh_spec = _svd_specs(geometry, (m, k), (k, n))
    v_spec = _transposed(vh_spec)
    pairs = functools.partial(_singular_pairs, m=m, n=n, pad=pad)
    u, s, vv, determined = _glue(geometry, (u_spec, P(None), v_spec, P(None)), pairs, w, v)
    u = _polished(u, determined, geometry, u_spec)
    vv = _polished(vv, determined, geometry, v_spec)
    specs = _svd_specs(geometry, (m, m if full else k), (n if full else k, n))

    def finish(u, vv, v):
        if full and m > n:  # the zeros' eigenvectors are (u; 0), u spanning range(A)^⊥
            u = jnp.concatenate([u, v[:m, pad + k : pad + m]], axis=1)
        if full and n > m:
            vv = jnp.concatenate([vv, v[m : m + n, pad + k : pad + n]], axis=1)
        return u, _h(vv)

    u, vh = _glue(geometry, (specs[0], specs[2]), finish, u, vv, v)
    return u, s, vh, status


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _svd(geometry, T_A, a):
    if _native_mp(geometry):
        return _svd_native(geometry, T_A, a)
    if qdwh.applies(geometry, a.shape):
        return qdwh.polar_and_svd(geometry, T_A, a)[2:]
    return _svd_program(geometry, T_A, False, a)


@_svd.defjvp
def _svd_jvp(geometry, T_A, primals, tangents):
    (a,), (da,) = primals, tangents
    u, s, vh, status = _svd(geometry, T_A, a)
    specs = _svd_specs(geometry, u.shape, vh.shape)
    du, ds, dvh = _glue(geometry, specs, _svd_tangents, u, s, vh, da)
    return (u, s, vh, status), (du, ds, dvh, np.zeros(status.shape, jax.dtypes.float0))


def _svd_tangents(u, s, vh, da):
    """JAX's rule for ``jnp.linalg.svd(a, full_matrices=False)`` (distinct singular values)."""
    m, n = da.shape
    v = _h(vh)
    ds_full = _mm(_mm(_h(u), da), v)
    ds = jnp.real(jnp.diagonal(ds_full))
    row = s[None, :]
    diffs = (row + row.T) * (row - row.T)
    eye = jnp.eye(s.shape[0], dtype=s.dtype)
    f = 1 / (diffs + eye) - eye
    dss = row.astype(da.dtype) * ds_full
    sds = row.T.astype(da.dtype) * ds_full
    zero = s == 0
    s_inv = jnp.where(zero, 0, 1 / jnp.where(zero, 1, s))
    du_dv_diag = 0.5 * (ds_full - _h(ds_full)) * jnp.diag(s_inv).astype(da.dtype)
    du = _mm(u, f * (dss + _h(dss)) + du_dv_diag)
    dv = _mm(v, f * (sds + _h(sds)))
    if m > n:
        du = du + _mm(da - _mm(u, _mm(_h(u), da)), v) / row.astype(da.dtype)
    if n > m:
        dv = dv + _mm(_h(da) - _mm(v, _mm(vh, _h(da))), u) / row.astype(da.dtype)
    return du, ds, _h(dv)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _svd_call(geometry, T_A, full, compute_uv, a):
    if geometry.engine.whole:
        a = _whole(a, geometry)
        if not compute_uv:
            status, s = _finite_status(a, jnp.linalg.svd(a, compute_uv=False))
            return None, s, None, status
        status, u, s, vh = _finite_status(a, *jnp.linalg.svd(a, full_matrices=full))
        specs = _svd_specs(geometry, u.shape, vh.shape)
        u, vh = _placed(u, geometry.mesh, specs[0]), _placed(vh, geometry.mesh, specs[2])
        return u, s, vh, status
    if full:
        u, s, vh, status = _svd_full(geometry, T_A, a)
    else:
        u, s, vh, status = _svd(geometry, T_A, a)
    return (u, s, vh, status) if compute_uv else (None, s, None, status)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _svd_full(geometry, T_A, a):
    return _svd_program(geometry, T_A, True, a)


@_svd_full.defjvp
def _svd_full_jvp(geometry, T_A, primals, tangents):
    raise NotImplementedError(
        "jaxmg.svd: derivatives of full_matrices=True are not defined (the completion of U or "
        "V is not unique), as for jnp.linalg.svd; use full_matrices=False."
    )


def _polar_factors(u_s, s, vh, side):
    u = _mm(u_s, vh)
    if side == "right":
        p = _mm(_h(vh) * s.astype(u.dtype)[None, :], vh)
    else:
        p = _mm(u_s * s.astype(u.dtype)[None, :], _h(u_s))
    return u, (p + _h(p)) / 2


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _polar_call(geometry, T_A, side, a):
    if geometry.engine.whole:
        a = _whole(a, geometry)
        u, p = jax.scipy.linalg.polar(a, side=side, method="svd")
        status, u, p = _finite_status(a, u, (p + _h(p)) / 2)
        u = _placed(u, geometry.mesh, _like_a(geometry, u.shape))
        return u, _placed(p, geometry.mesh, _like_a(geometry, p.shape)), status
    if side == "right" and qdwh.applies(geometry, a.shape) and not _native_mp(geometry):
        return _polar_qdwh(geometry, T_A, a)
    return _polar_by_svd(geometry, T_A, side, a)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _polar_qdwh(geometry, T_A, a):
    """QDWH's own factors ``(U_p, H, status)``, without the SVD's eigensolver and products."""
    return qdwh.polar(geometry, a)


@_polar_qdwh.defjvp
def _polar_qdwh_jvp(geometry, T_A, primals, tangents):
    """The SVD route's derivatives (JAX's rule for the SVD, distinct singular values)."""
    return jax.jvp(functools.partial(_polar_by_svd, geometry, T_A, "right"), primals, tangents)


def _polar_by_svd(geometry, T_A, side, a):
    """``(U, P, status)`` from the SVD: ``U = U_s Vh``, ``P`` ``V diag(s) Vh`` (right) or
    ``U_s diag(s) U_s^H`` (left)."""
    u_s, s, vh, status = _svd(geometry, T_A, a)
    m, n = a.shape
    if side == "right" and qdwh.applies(geometry, a.shape):  # ring products, as U_s and Vh
        spec, mesh = geometry.spec, geometry.mesh
        vs = _glue(geometry, spec, lambda vh, s: _h(vh) * s.astype(vh.dtype)[None, :], vh, s)
        u = products.times(u_s, vh, mesh, spec)
        p = products.times(vs, vh, mesh, spec)
        return u, _glue(geometry, spec, lambda p: (p + _h(p)) / 2, p), status
    p_shape = (n, n) if side == "right" else (m, m)
    specs = (_like_a(geometry, a.shape), _like_a(geometry, p_shape))
    u, p = _glue(geometry, specs, functools.partial(_polar_factors, side=side), u_s, s, vh)
    return u, p, status


def _inverted_values(s, rcond):
    """``1 / s`` where ``s`` counts (``s >= rcond * s[0]``, ``s > 0``), else 0; and the rank."""
    mask = (s > 0) & (s >= rcond * s[0])
    return jnp.where(mask, 1 / jnp.where(mask, s, 1), 0), mask.sum()


def _pseudo_inverse_solve(u, s_inv, vh, a, b):
    """``x = V diag(s_inv) U^H b`` and the squared residual norms of ``b - A x``'s columns."""
    x = _mm(_h(vh), s_inv[:, None].astype(b.dtype) * _mm(_h(u), b))
    return x, jnp.linalg.norm(b - _mm(a, x), axis=0) ** 2


def _sharded_pseudo_inverse_solve(geometry, u, s_inv, vh, a, b):
    """:func:`_pseudo_inverse_solve` for ``U``, ``Vh`` and ``A`` sharded like ``A`` (by rows or
    by columns): each device multiplies its own blocks, and only ``[N, K]`` sums and pieces of
    the solution move (XLA's partitioner would gather ``U``, ``Vh`` or ``A`` whole)."""
    axis = geometry.axis
    rows = geometry.form == "rows"

    def body(u, s_inv, vh, a, b):
        me = lax.axis_index(axis)
        if rows:  # local u [M/p, k], vh [k/p, N], a [M/p, N]
            b_me = lax.dynamic_slice_in_dim(b, me * u.shape[0], u.shape[0])
            d = s_inv[:, None].astype(b.dtype) * lax.psum(_mm(_h(u), b_me), axis)
            d_me = lax.dynamic_slice_in_dim(d, me * vh.shape[0], vh.shape[0])
            x = lax.psum(_mm(_h(vh), d_me), axis)
            r2 = lax.psum(jnp.sum(jnp.abs(b_me - _mm(a, x)) ** 2, axis=0), axis)
            return x, r2
        # by columns: local u [M, k/p], vh [k, N/p], a [M, N/p]
        s_me = lax.dynamic_slice_in_dim(s_inv, me * u.shape[1], u.shape[1])
        d = lax.all_gather(s_me[:, None].astype(b.dtype) * _mm(_h(u), b), axis, tiled=True)
        x_me = _mm(_h(vh), d)
        r2 = jnp.sum(jnp.abs(b - lax.psum(_mm(a, x_me), axis)) ** 2, axis=0)
        return lax.all_gather(x_me, axis, tiled=True), r2

    spec = geometry.spec
    return jax.shard_map(
        body,
        mesh=geometry.mesh,
        in_specs=(spec, P(None), spec, spec, _REPLICATED),
        out_specs=(_REPLICATED, P(None)),
        check_vma=False,
    )(u, s_inv, vh, a, b)


def _lstsq_by_svd(geometry, T_A, a, b, rcond):
    """``(x, residuals, rank, s, status)`` by the SVD's pseudo-inverse: any rank."""
    u, s, vh, status = _svd(geometry, T_A, a)
    s_inv, rank = _glue(geometry, (P(None), P()), _inverted_values, s, rcond)
    like_a = (_like_a(geometry, x.shape) == geometry.spec for x in (u, vh, a))
    if geometry.form in ("rows", "cols") and all(like_a):
        x, resid = _sharded_pseudo_inverse_solve(geometry, u, s_inv, vh, a, b)
    else:
        specs = (_REPLICATED, P(None))
        x, resid = _glue(geometry, specs, _pseudo_inverse_solve, u, s_inv, vh, a, b)
    return x, resid, rank, s, status


def _by_qr(geometry, a):
    """Whether ``lstsq`` tries QR first: ``A`` tall enough that ``R`` (``N x N``) whole fits in
    a block of ``A`` (``M >= ndev N``), on an engine without rectangular routines of its own."""
    m, n = a.shape
    return geometry.form in ("rows", "cols") and not _native_mp(geometry) and m >= geometry.ndev * n


def _lstsq_by_qr(geometry, T_A, a, b, rcond):
    """``(x, residuals, rank, s, status)`` of a full-rank tall ``A`` by its QR (CholeskyQR2, or
    shifted CholeskyQR: :mod:`jaxmg.decompositions.qr`): ``x = R^{-1} Q^H b``, with ``R``
    whole on every device (a block of ``A`` at most, :func:`_by_qr`) and its singular values
    (those of ``A``) from JAX's own SVD on one device. Where the QR fails or ``R``'s singular values
    fall below ``rcond * s[0]`` (not full rank), the SVD's pseudo-inverse
    (:func:`_lstsq_by_svd`), in a ``lax.cond``: only the branch taken runs."""
    n = a.shape[1]
    q, r, status = qr_module._qr(geometry, a)
    qhb, r = _glue(
        geometry, (_REPLICATED, _REPLICATED), lambda q, b, r: (_mm(_h(q), b), r), q, b, r
    )

    s = _singular_values_on_one_device(geometry, r)

    def solved(r, qhb, s, rcond):
        x = jax.scipy.linalg.solve_triangular(r, qhb, lower=False)
        return x, (s[-1] > rcond * s[0]) & jnp.all(jnp.isfinite(s))

    x, full = _glue(geometry, (_REPLICATED, P()), solved, r, qhb, s, rcond)
    full = full & (status == 0)

    def by_qr(a, b):
        resid = _glue(
            geometry, P(None), lambda a, x, b: jnp.linalg.norm(b - _mm(a, x), axis=0) ** 2, a, x, b
        )
        return x, resid, jnp.asarray(n, jnp.int32), s, jnp.zeros((), jnp.int32)

    def by_svd(a, b):
        x, resid, rank, s, status = _lstsq_by_svd(geometry, T_A, a, b, rcond)
        return x, resid, rank.astype(jnp.int32), s, status.astype(jnp.int32)

    return lax.cond(full, by_qr, by_svd, a, b)


def _singular_values_on_one_device(geometry, r):
    """The singular values of ``r`` (whole on every device) by JAX's own SVD on the solver
    axis's first device alone, then summed over the axis (the others contribute zeros): the
    same SVD on every device is ``ndev`` times the work where devices share a host."""
    n = r.shape[0]
    real = jnp.finfo(r.dtype).dtype
    axis = geometry.axis

    def body(r):
        first = lax.axis_index(axis) == 0
        s = lax.cond(
            first,
            lambda r: jnp.linalg.svd(r, compute_uv=False).astype(real),
            lambda r: jnp.zeros((n,), real),
            r,
        )
        return lax.psum(s, axis)

    return jax.shard_map(
        body, mesh=geometry.mesh, in_specs=_REPLICATED, out_specs=P(None), check_vma=False
    )(r)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _lstsq_call(geometry, T_A, a, b, rcond):
    if geometry.engine.whole:
        a = _whole(a, geometry)
        x, resid, rank, s = jnp.linalg.lstsq(a, b, rcond=rcond)
        status, s = _finite_status(a, s)  # of A alone: b's NaN is x's, not a failure
        x, resid = (jnp.where(status == 0, v, jnp.full_like(v, jnp.nan)) for v in (x, resid))
        return x, resid, rank, s, status
    if _by_qr(geometry, a):
        return _lstsq_by_qr(geometry, T_A, a, b, rcond)
    return _lstsq_by_svd(geometry, T_A, a, b, rcond)
