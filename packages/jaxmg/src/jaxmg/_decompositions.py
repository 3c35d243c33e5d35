"""svd, polar, lstsq and qr of a sharded matrix, composed of jaxmg's own distributed routines.

Neither cuSolverMg nor its LAPACK twin has an SVD or a QR, so these are built from what the
engines do run, with sharded products between the calls (XLA's, and ring products of
:mod:`jaxmg._products` for the Gram matrices), on every backend and platform the routines they
call run on:

- ``svd``: the Hermitian eigenproblem of the Jordan-Wielandt matrix ``B = [[0, A], [A^H, 0]]``
  (``syevd`` of ``M + N`` columns). Its eigenvalues are ``±σ_i`` (and ``|M - N|`` zeros), the
  eigenvector of ``+σ_i`` is ``(u_i; v_i) / sqrt(2)``. ``syevd`` is backward stable, so the
  singular values carry LAPACK's absolute error (``O(ε ||A||)``) whatever the condition number,
  and each singular vector the error of its gap, as ``gesvd``'s. The price: ``8x`` the
  eigensolver's work of an ``N x N`` problem, and a matrix of ``(M + N)^2`` elements.
- ``polar``: ``U = U_s Vh``, ``H = V diag(s) Vh`` from the SVD.
- ``lstsq``: the pseudo-inverse of the SVD, singular values below ``rcond * s[0]`` dropped
  (``jnp.linalg.lstsq``'s rule).
- ``qr``: shifted CholeskyQR (Fukaya, Kannan, Nakatsukasa, Yamamoto, Yanagisawa 2020): two
  Cholesky factorisations of shifted Gram matrices ``X^H X + s I`` (``cho_factor``) make ``Q_2``
  well enough conditioned for two plain CholeskyQR steps to finish; each ``A R^{-1}`` is one
  LU solve with ``R^H`` (``lu_solve``). Full column rank ``A`` with ``cond(A)`` up to about
  1e14 in float64 (tested at N = 1024); beyond, a Cholesky factorisation fails, and the status
  says which.

On a solver axis of one device with the default backend they are JAX's own
(``jnp.linalg.svd``, ``qr``, ``lstsq``, ``jax.scipy.linalg.polar``), with JAX's derivatives.

Backend ``"mp"`` on CPUs runs ScaLAPACK's own routines instead (``jaxmg_cuda.mp.gesvd``,
``qr``, ``gels``): ``svd`` (``full_matrices=False``), ``polar`` and ``lstsq`` on ``p?gesvd``,
``qr`` on ``p?geqrf`` + ``p?orgqr`` (``p?ungqr``), on the 1D forms and on a process grid
``P(r, c)``; each process's block of ``A`` goes to the engine as it is and the results come
back whole on every process, then are sharded like ``A``. ``lstsq`` stays on the SVD because
its contract (``s``, the numerical rank, ``rcond``) is more than ``p?gels`` (full rank only)
gives; ``p?gels`` is :func:`gels`. On GPUs (cuSOLVERMp) these routines are not built and the
compositions run.

Derivatives: each composition is one jitted function under a ``custom_jvp`` rule, JAX's rules
for ``svd`` (distinct singular values, ``full_matrices=False``) and ``qr`` (``M >= N``) written
with the same sharded products; ``polar`` and ``lstsq`` differentiate through the SVD, as
``jnp.linalg.lstsq`` does. ScaLAPACK's ``svd`` takes the same rule; its ``qr`` takes JAX's
rule on the first ``K`` columns (``dA_1 R_1^{-1}`` by a triangular solve with the replicated
``R_1``) and, for ``M < N``, the product rule for ``R_2 = Q^H A_2``.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jaxmg_cuda.mp

from . import _api, _checks, _geometry, _products, _v1_status
from ._call import engine_relays_blocks, locate
from ._checks import AnyMesh, Backend, Result, Specs
from ._local import _explicit, _placed

_HIGHEST = jax.lax.Precision.HIGHEST


def _mm(a, b):
    return jnp.matmul(a, b, precision=_HIGHEST)


def _h(a):
    return jnp.conj(a).T


# --- where A lives --------------------------------------------------------------------------------


def _where(A, mesh, in_specs, backend, fn):
    """Checks before any device work: ``A``'s type and shape, the sharding it is solved on."""
    (spec,) = _checks.in_specs(in_specs, fn, ("A",))
    geometry, dtype = locate(A, mesh, spec, backend, fn)
    m, n = A.shape
    if geometry.form == "grid":
        if not _native_mp(geometry):
            raise ValueError(
                f"{fn}: A sharded over a process grid P(r, c) runs on ScaLAPACK's own routines "
                "only (backend 'mp' on CPUs); the compositions of backend 'mp' on GPUs take A "
                "sharded by rows P(ax, None) or by columns P(None, ax) of one mesh axis."
            )
        rows, cols = geometry.grid
        if m % rows or n % cols:
            raise ValueError(
                f"{fn}: A of shape {(m, n)} is sharded P(r, c) over a {rows}x{cols} process "
                f"grid: M must be divisible by {rows} and N by {cols}."
            )
    else:
        sharded = m if geometry.form == "rows" else n
        if sharded % geometry.ndev:
            raise ValueError(
                f"{fn}: A of shape {(m, n)} is sharded by {geometry.form} over {geometry.ndev} "
                f"devices of axis {geometry.axis!r}, which does not divide {sharded}."
            )
    if min(m, n) == 0:
        raise ValueError(f"{fn}: A must have at least one row and one column, got {(m, n)}.")
    return geometry, dtype


def _like_a(geometry, shape):
    """The sharding of a result of ``shape`` that goes "like ``A``": over the same axes and
    dimensions where the device counts divide them, else replicated."""
    if geometry.form == "grid":
        rows, cols = geometry.grid
        return geometry.spec if shape[0] % rows == 0 and shape[1] % cols == 0 else _REPLICATED
    dim = shape[0] if geometry.form == "rows" else shape[1]
    return geometry.spec if dim % geometry.ndev == 0 else _REPLICATED


_REPLICATED = P(None, None)


def _engine(geometry):
    """The backend the composed routines ask for (``None`` leaves the choice to them)."""
    return geometry.backend if geometry.backend in ("mg", "mp") else None


def _glue(geometry, out_specs, f, *args):
    """``f(*args)`` (the products, slices and concatenations between two solver calls) placed
    by XLA's partitioner, its results sharded as ``out_specs`` says. On Explicit axes every
    operation's operands would have to agree on their shardings already: there ``f`` runs
    with the axes Auto (``jax.sharding.auto_axes``)."""
    mesh = geometry.mesh
    if _explicit(mesh, geometry.spec):
        abstract = mesh.abstract_mesh if isinstance(mesh, jax.sharding.Mesh) else mesh
        with jax.sharding.use_abstract_mesh(abstract):
            return jax.sharding.auto_axes(f, out_sharding=out_specs)(*args)
    out = f(*args)
    return jax.tree.map(
        lambda x, spec: _placed(x, mesh, spec), out, out_specs, is_leaf=lambda x: x is None
    )


# --- backend "mp" on CPUs: ScaLAPACK's own routines


def _native_mp(geometry):
    """Whether ScaLAPACK's own p?gesvd, p?geqrf + p?orgqr and p?gels run: backend ``"mp"`` on
    CPUs, the engine that also relays blocks itself. On GPUs (cuSOLVERMp) the compositions run:
    its Gesvd, Geqrf and Gels are not built."""
    return engine_relays_blocks(geometry)


def _mp_grid(geometry):
    """The process grid of ``A``'s blocks: ``P(r, c)``'s, ``P x 1`` by rows, ``1 x P`` by
    columns."""
    if geometry.form == "grid":
        return geometry.grid
    return (geometry.ndev, 1) if geometry.form == "rows" else (1, geometry.ndev)


def _mp_tile(geometry, T_A, shape):
    """The engine's square tile: ``T_A``, else 64 or the smaller side of a block."""
    if T_A is not None:
        return int(T_A)
    rows, cols = _mp_grid(geometry)
    return max(1, min(64, shape[0] // rows, shape[1] // cols))


def _mp_call(geometry, wrapper, tile, a, *replicated):
    """``wrapper`` (a ``jaxmg_cuda.mp`` rectangular target) on each process's block of ``a``
    (transposed: the column-major block) and the ``replicated`` operands; every result comes
    back whole and replicated, the status as a scalar last."""
    m, n = a.shape
    kw = dict(m=m, n=n, grid=_mp_grid(geometry), T_A=tile)

    def body(block, *rest):
        return wrapper(block.T, *rest, geometry.position(), **kw)

    out = jax.shard_map(
        body,
        mesh=geometry.mesh,
        in_specs=(geometry.spec,) + (_REPLICATED,) * len(replicated),
        out_specs=P(),
        check_vma=False,
    )(a, *replicated)
    return (*out[:-1], out[-1][0])


def _svd_native(geometry, T_A, a):
    u, s, vh, status = _mp_call(geometry, jaxmg_cuda.mp.gesvd, _mp_tile(geometry, T_A, a.shape), a)
    specs = _svd_specs(geometry, u.shape, vh.shape)
    return _placed(u, geometry.mesh, specs[0]), s, _placed(vh, geometry.mesh, specs[2]), status


def _positive_diagonal(q, r):
    """``Q D``, ``D^H R`` with ``D`` the phases of ``R``'s diagonal: that diagonal real and
    non-negative (LAPACK's Householder QR leaves it of any sign)."""
    d = jnp.diagonal(r)
    phase = jnp.where(d == 0, 1, d / jnp.where(d == 0, 1, jnp.abs(d)).astype(d.dtype))
    return q * phase[None, :], jnp.conj(phase)[:, None] * r


def _qr_tangents(q, r, da_rinv):
    """JAX's rule for ``jnp.linalg.qr`` (``M >= N``), given ``dA R^{-1}``: with ``C = Q^H dA
    R^{-1}`` and ``Ω = tril(C, -1) - tril(C, -1)^H`` (its diagonal the imaginary part of
    ``C``'s, for complex ``A``), ``dQ = Q (Ω - C) + dA R^{-1}`` and ``dR = (C - Ω) R``."""
    c = _mm(_h(q), da_rinv)
    lower = jnp.tril(c, -1)
    omega = lower - _h(lower)
    if jnp.issubdtype(c.dtype, jnp.complexfloating):
        imaginary = jnp.diag(jnp.imag(jnp.diagonal(c))).astype(c.dtype)
        omega = omega + imaginary * jnp.asarray(1j, c.dtype)
    return _mm(q, omega - c) + da_rinv, _mm(c - omega, r)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _qr_native(geometry, T_A, a):
    """``(Q, R, status)`` of any ``[M, N]`` ``a`` by p?geqrf and p?orgqr (p?ungqr)."""
    q, r, status = _mp_call(geometry, jaxmg_cuda.mp.qr, _mp_tile(geometry, T_A, a.shape), a)
    q, r = _positive_diagonal(q, r)
    q = _placed(q, geometry.mesh, _like_a(geometry, q.shape))
    return q, _placed(r, geometry.mesh, _like_a(geometry, r.shape)), status


@_qr_native.defjvp
def _qr_native_jvp(geometry, T_A, primals, tangents):
    """:func:`_qr_jvp`'s rule on the first ``K`` columns, ``A_1 = Q R_1`` (``R_1`` replicated
    and small: ``dA_1 R_1^{-1}`` by a triangular solve); for ``M < N`` the rest of ``R``,
    ``R_2 = Q^H A_2``, by the product rule."""
    (a,), (da,) = primals, tangents
    q, r, status = _qr_native(geometry, T_A, a)
    m, n = a.shape
    k = min(m, n)

    def rule(q, r, a, da):
        r1 = r[:, :k]
        da_rinv = jax.scipy.linalg.solve_triangular(r1, da[:, :k].T, trans="T", lower=False).T
        dq, dr = _qr_tangents(q, r1, da_rinv)
        if n > m:
            dr = jnp.concatenate([dr, _mm(_h(dq), a[:, m:]) + _mm(_h(q), da[:, m:])], axis=1)
        return dq, dr

    specs = (_like_a(geometry, q.shape), _like_a(geometry, r.shape))
    dq, dr = _glue(geometry, specs, rule, q, r, a, da)
    return (q, r, status), (dq, dr, np.zeros(status.shape, jax.dtypes.float0))


def gels(
    A: jax.Array,
    b: jax.Array,
    mesh: AnyMesh | None = None,
    in_specs: Specs | None = None,
    *positional: Any,
    T_A: int | None = None,
    return_status: bool = False,
) -> Result:
    """ScaLAPACK's p?gels on a sharded ``[M, N]`` ``A`` of full rank (backend ``"mp"`` on CPUs
    only): the least-squares solution of ``A x = b`` for ``M >= N``, the minimum-norm one for
    ``M < N``, through a QR (``M >= N``) or LQ factorisation.

    Args:
      A: as for :func:`svd`, also over a process grid ``P(r, c)`` (``M`` divisible by ``r``,
        ``N`` by ``c``).
      b: ``[M]`` or ``[M, K]``, ``A``'s dtype (replicated for the solve).
      T_A: the engine's square tile (default: 64, or the smaller side of a block).
      return_status: also return the status: 0, or ``k > 0`` when the ``k``-th diagonal entry
        of the triangular factor is exactly zero (``x`` is then NaN). A nearly rank-deficient
        ``A`` is not detected: its ``x`` is large and inaccurate; use :func:`lstsq`, which
        drops the small singular values.

    Returns ``x`` (``[N]`` or ``[N, K]``, replicated), and the status. No derivatives.
    """
    fn = "jaxmg.gels"
    _checks.keyword_only(fn, positional, "T_A or return_status, e.g. return_status=True")
    geometry, dtype = _where(A, mesh, in_specs, "mp", fn)
    if not _native_mp(geometry):
        raise ValueError(f"{fn}: p?gels runs on CPUs only (ScaLAPACK); use jaxmg.lstsq on GPUs.")
    m, n = A.shape
    b_shape = _checks.rhs_shape(b, m, dtype, fn)
    T_A = _checks.tile_size(T_A, fn)
    a = _placed(A, geometry.mesh, geometry.spec)
    b2 = _placed(jnp.reshape(b, (m, -1)), geometry.mesh, _REPLICATED)
    x, status = _gels_call(geometry, _mp_tile(geometry, T_A, (m, n)), a, b2)
    x = x[:, 0] if len(b_shape) == 1 else x
    return (x, status) if return_status else x


@functools.partial(jax.jit, static_argnums=(0, 1))
def _gels_call(geometry, tile, a, b):
    return _mp_call(geometry, jaxmg_cuda.mp.gels, tile, a, b)


# --- svd: the Jordan-Wielandt eigenproblem


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
    """Two Newton-Schulz steps on the ``determined`` columns of ``x``: mixing of an
    eigenvector with other pairs' leaves ``X^H X`` off the identity by ``O(ε ||A|| / gap)``,
    which each step squares. The other columns take no part, so that they cannot spoil the
    determined ones. Sharded ``x``: ring products (:mod:`jaxmg._products`); replicated: XLA's."""
    if spec != _REPLICATED:
        return _products.newton_schulz(x, determined, geometry.mesh, spec)

    def steps(x, keep):
        kept = jnp.where(keep[None, :], x, 0)
        eye = jnp.eye(x.shape[1], dtype=x.dtype)
        for _ in range(2):
            kept = kept + _mm(kept, eye - _mm(_h(kept), kept)) / 2
        return jnp.where(keep[None, :], kept, x)

    return _glue(geometry, _REPLICATED, steps, x, determined)


def _svd_specs(geometry, u_shape, vh_shape):
    """Where ``U``, ``s``, ``Vh`` (and their tangents) go: ``U`` and ``Vh`` like ``A``."""
    return _like_a(geometry, u_shape), P(None), _like_a(geometry, vh_shape)


def _transposed(spec):
    return P(spec[1], spec[0])


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _svd_program(geometry, T_A, full, a):
    """``(U, s, Vh, status)`` of ``a`` (``full``: ``U`` is ``M x M`` and ``Vh`` ``N x N``)."""
    m, n = a.shape
    k = min(m, n)
    pad = -(m + n) % geometry.ndev
    b = _glue(geometry, geometry.spec, functools.partial(_jordan_wielandt, pad=pad), a)
    w, v, status = _api.syevd(
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


# --- qr: shifted CholeskyQR


def _upper_factor(f, form):
    """``R`` with ``G = R^H R`` from a Cholesky factor made with ``T_A = N / ndev`` (each
    device's tiles are then its own block): ``L^T`` by columns, ``R`` itself by rows (the
    factor of ``conj(G)``); the other triangle holds what the engine did not write."""
    r = jnp.triu(f)
    return jnp.conj(r) if form == "cols" else r


def _cholesky_qr(a, geometry, shift):
    """``Q = A R^{-1}``, ``R`` and the factorisation's status, ``R^H R = A^H A + shift I``."""
    n = a.shape[1]
    spec = geometry.spec

    if _like_a(geometry, a.shape) == spec:  # a ring product: no whole N x N per device
        g = _products.gram(a, a, geometry.mesh, spec)
    else:
        g = _glue(geometry, spec, lambda a: _mm(_h(a), a), a)
    if shift is not None:
        g = _glue(geometry, spec, lambda g, s: g + s * jnp.eye(n, dtype=g.dtype), g, shift)
    factor = _api.cho_factor(
        g, T_A=n // geometry.ndev, mesh=geometry.mesh, in_specs=spec, backend=_engine(geometry)
    )
    upper = functools.partial(_upper_factor, form=geometry.form)
    r = _glue(geometry, spec, upper, factor.factor)
    return _right_solve(a, r, geometry), r, factor.status


def _right_solve(x, r, geometry):
    """``X R^{-1}`` as ``(R^{-H} X^H)^H``: one LU solve (backward stable) with the sharded
    ``R^H``; ``X`` comes back sharded like ``A``."""
    spec = geometry.spec
    rh, xh = _glue(geometry, (spec, _REPLICATED), lambda r, x: (_h(r), _h(x)), r, x)
    y = _api.lu_solve(rh, xh, mesh=geometry.mesh, in_specs=spec, backend=_engine(geometry))
    return _glue(geometry, _like_a(geometry, x.shape), _h, y)


def _right_solve_linear(x, r, geometry):
    """``X R^{-1}`` as a linear map of ``X`` that reverse mode can transpose: the solver's
    calls are no JAX primitives, so its transpose ``Y R^{-T}`` is given explicitly."""
    spec = geometry.spec
    rt = _glue(geometry, spec, jnp.transpose, r)
    return jax.lax.custom_linear_solve(
        lambda y: _glue(geometry, _like_a(geometry, y.shape), _mm, y, r),
        x,
        solve=lambda _, b: _right_solve(b, r, geometry),
        transpose_solve=lambda _, b: _right_solve(b, rt, geometry),
    )


@functools.partial(jax.jit, static_argnums=0)
def _qr_program(geometry, a):
    """``(Q, R, status)`` of ``a`` (``M >= N``): two shifted CholeskyQR steps, then two plain
    ones (shifted CholeskyQR3 with one more shifted step, for the largest ``N``)."""
    m, n = a.shape
    eps = float(np.finfo(a.dtype).eps)

    def shift(x):  # Fukaya et al.'s: 11 (M N + N (N + 1)) ε ||X||_F^2
        return (11 * (m * n + n * (n + 1)) * eps * jnp.real(jnp.vdot(x, x))).astype(x.dtype)

    q, factors, statuses = a, [], []
    for shifted in (True, True, False, False):
        s = _glue(geometry, P(), shift, q) if shifted else None
        q, r_k, st = _cholesky_qr(q, geometry, s)
        factors.append(r_k)
        statuses.append(st)

    def product(*rs):  # R = R_4 R_3 R_2 R_1
        r = rs[0]
        for r_k in rs[1:]:
            r = _mm(r_k, r)
        return jnp.triu(r)

    r = _glue(geometry, _like_a(geometry, (n, n)), product, *factors)
    # Dependent columns need not make a factorisation fail (the shift keeps the first Gram
    # matrix positive definite): Q's columns then are not orthonormal, and the status says so.
    lost = _glue(
        geometry, P(), lambda q: jnp.max(jnp.abs(_mm(_h(q), q) - jnp.eye(n, dtype=q.dtype))), q
    )
    status = jnp.asarray(0, jnp.int32)
    for st in reversed(statuses):  # the first factorisation that failed
        status = jnp.where(st != 0, st, status)
    status = jnp.where((status == 0) & ~(lost < _DEPENDENT), n + 1, status)
    nan = jnp.asarray(jnp.nan, a.dtype)
    q, r = (jnp.where(status == 0, x, nan) for x in (q, r))
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


# --- one jitted call each (derivative rules run only inside jitted programs)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _svd_call(geometry, T_A, full, compute_uv, a):
    if geometry.backend == "jax":
        a = _whole(a, geometry)
        if not compute_uv:
            s = jnp.linalg.svd(a, compute_uv=False)
            return None, s, None, _finite_status(s)
        u, s, vh = jnp.linalg.svd(a, full_matrices=full)
        specs = _svd_specs(geometry, u.shape, vh.shape)
        u, vh = _placed(u, geometry.mesh, specs[0]), _placed(vh, geometry.mesh, specs[2])
        return u, s, vh, _finite_status(s)
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


def _whole(a, geometry):
    """``a`` unsharded on its solver axis of one device (JAX's decompositions take no sharded
    dimension): no data moves."""
    return _placed(a, geometry.mesh, _REPLICATED)


def _finite_status(x):
    """JAX's dense solvers return NaN where LAPACK would report a failure: status 1 then."""
    return jnp.where(jnp.all(jnp.isfinite(x)), 0, 1).astype(jnp.int32)


def _polar_factors(u_s, s, vh, side):
    u = _mm(u_s, vh)
    if side == "right":
        p = _mm(_h(vh) * s.astype(u.dtype)[None, :], vh)
    else:
        p = _mm(u_s * s.astype(u.dtype)[None, :], _h(u_s))
    return u, (p + _h(p)) / 2


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _polar_call(geometry, T_A, side, a):
    if geometry.backend == "jax":
        a = _whole(a, geometry)
        u, p = jax.scipy.linalg.polar(a, side=side, method="svd")
        p = (p + _h(p)) / 2
        u = _placed(u, geometry.mesh, _like_a(geometry, u.shape))
        return u, _placed(p, geometry.mesh, _like_a(geometry, p.shape)), _finite_status(p)
    u_s, s, vh, status = _svd(geometry, T_A, a)
    m, n = a.shape
    p_shape = (n, n) if side == "right" else (m, m)
    specs = (_like_a(geometry, a.shape), _like_a(geometry, p_shape))
    u, p = _glue(geometry, specs, functools.partial(_polar_factors, side=side), u_s, s, vh)
    return u, p, status


def _pseudo_inverse_solve(u, s, vh, a, b, rcond):
    mask = (s > 0) & (s >= rcond * s[0])
    safe = jnp.where(mask, s, 1).astype(a.dtype)
    s_inv = jnp.where(mask, 1 / safe, 0)[:, None]
    x = _mm(_h(vh), s_inv * _mm(_h(u), b))
    resid = jnp.linalg.norm(b - _mm(a, x), axis=0) ** 2
    return x, resid, mask.sum()


@functools.partial(jax.jit, static_argnums=(0, 1))
def _lstsq_call(geometry, T_A, a, b, rcond):
    if geometry.backend == "jax":
        a = _whole(a, geometry)
        x, resid, rank, s = jnp.linalg.lstsq(a, b, rcond=rcond)
        return x, resid, rank, s, _finite_status(s)
    u, s, vh, status = _svd(geometry, T_A, a)
    specs = (_REPLICATED, P(None), P())
    x, resid, rank = _glue(geometry, specs, _pseudo_inverse_solve, u, s, vh, a, b, rcond)
    return x, resid, rank, s, status


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _qr_call(geometry, mode, T_A, a):
    m, n = a.shape
    if geometry.backend == "jax":
        a = _whole(a, geometry)
        q, r = _positive_diagonal(*jnp.linalg.qr(a))  # as the other paths give R
        q = _placed(q, geometry.mesh, _like_a(geometry, q.shape))
        r = _placed(r, geometry.mesh, _like_a(geometry, r.shape))
        return (None if mode == "r" else q), r, _finite_status(r)
    if _native_mp(geometry):
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


# --- the public functions -------------------------------------------------------------------------


def svd(
    A: jax.Array,
    full_matrices: bool = False,
    compute_uv: bool = True,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    in_specs: Specs | None = None,
    *positional: Any,
    return_status: bool = False,
    backend: Backend = None,
) -> Result:
    """Singular value decomposition ``A = U diag(s) Vh`` of a sharded ``[M, N]`` matrix.

    Args:
      A: ``[M, N]`` (any ``M``, ``N``) float32, float64, complex64 or complex128, sharded by
        rows ``P(ax, None)`` or columns ``P(None, ax)`` of one mesh axis whose device count
        divides the sharded dimension; with backend ``"mp"`` on CPUs also over a process grid
        ``P(r, c)`` (``M`` divisible by ``r``, ``N`` by ``c``; ``full_matrices=False``).
      full_matrices: ``U`` is ``[M, M]`` and ``Vh`` ``[N, N]`` (``False``, the default:
        ``[M, K]`` and ``[K, N]``, ``K = min(M, N)``). Full matrices have no derivatives.
      compute_uv: also return ``U`` and ``Vh`` (else ``s`` alone).
      T_A: the tile of the eigensolver's ``(M + N)``-column matrix, as for
        :func:`jaxmg.syevd`; with backend ``"mp"`` on CPUs ``p?gesvd``'s square tile (default:
        64, or the smaller side of a block); mesh, in_specs, backend: as for
        :func:`jaxmg.potrs`.
      return_status: also return the status: 0, or the eigensolver's (``p?gesvd``'s) ``k > 0``
        when it did not converge (the outputs are then NaN).

    Returns:
      ``(U, s, Vh)`` (``s`` real, descending, replicated; ``U`` sharded as ``A`` where the
      device count divides its sharded dimension, else replicated; ``Vh`` likewise), or ``s``;
      the status last with ``return_status``.

    How: the eigenvectors of ``[[0, A], [A^H, 0]]`` (module :mod:`jaxmg._decompositions`),
    or ScaLAPACK's ``p?gesvd`` with backend ``"mp"`` on CPUs (``full_matrices=False``);
    singular values to ``O(ε ||A||)`` whatever the condition number. Singular vectors of
    singular values below ``ε ||A||`` (a rank-deficient ``A``) are not determined and need not
    be orthonormal. Derivatives (``full_matrices=False``): JAX's rule for distinct singular
    values.
    """
    fn = "jaxmg.svd"
    _checks.keyword_only(fn, positional, "return_status or backend, e.g. return_status=True")
    T_A = _checks.tile_size(T_A, fn)
    u, s, vh, status, _ = _svd_of(
        A, bool(full_matrices), bool(compute_uv), T_A, mesh, in_specs, backend, fn
    )
    out = (u, s, vh) if compute_uv else (s,)
    out += (status,) if return_status else ()
    return out if len(out) > 1 else out[0]


def _svd_of(A, full, compute_uv, T_A, mesh, in_specs, backend, fn):
    """:func:`svd`'s checks and call: ``(U, s, Vh, status, geometry)``."""
    geometry, _ = _where(A, mesh, in_specs, backend, fn)
    if full and geometry.form == "grid":
        raise ValueError(
            f"{fn}: full_matrices=True runs through the Jordan-Wielandt composition, which "
            "takes A sharded by rows P(ax, None) or by columns P(None, ax), not P(r, c); "
            "p?gesvd runs with full_matrices=False."
        )
    a = _placed(A, geometry.mesh, geometry.spec)
    return (*_svd_call(geometry, T_A, full, compute_uv, a), geometry)


def _polar_of(A, T_A, mesh, in_specs, side, backend, fn):
    """:func:`polar`'s call: ``(U, P, status, geometry)``."""
    geometry, _ = _where(A, mesh, in_specs, backend, fn)
    a = _placed(A, geometry.mesh, geometry.spec)
    return (*_polar_call(geometry, T_A, side, a), geometry)


def _qr_of(A, T_A, mesh, in_specs, mode, backend, fn):
    """:func:`qr`'s checks and call: ``(Q or None, R, status, geometry)``."""
    if mode not in ("reduced", "r"):
        raise ValueError(f"{fn}: mode must be 'reduced' or 'r', got {mode!r}.")
    geometry, _ = _where(A, mesh, in_specs, backend, fn)
    k = min(A.shape)
    if geometry.backend != "jax" and not _native_mp(geometry) and k % geometry.ndev:
        raise ValueError(
            f"{fn}: min(M, N) = {k} must be divisible by the {geometry.ndev} devices of axis "
            f"{geometry.axis!r} (the Gram matrix of the first {k} columns is factored by "
            "jaxmg.cho_factor over them)."
        )
    a = _placed(A, geometry.mesh, geometry.spec)
    return (*_qr_call(geometry, mode, T_A, a), geometry)


def _v1_options(fn, T_A, pad, donate, in_specs, matrix_specs):
    """The options jaxmg 1.x's form adds, checked: ``(T_A, in_specs, v1)`` (``v1``: the call
    named ``matrix_specs=``). ``pad`` has no effect on the compositions (they pad no tiles);
    ``donate`` is checked here and acted on by :func:`_give_up`."""
    if isinstance(T_A, str):
        raise TypeError(
            f"{fn}: T_A (the second positional argument, as in jaxmg 1.x) is a tile size, got "
            f"{T_A!r}; pass numpy-style options by name, e.g. mode='r' or side='left'."
        )
    _checks.flag(pad, "pad", fn)
    _checks.flag(donate, "donate", fn)
    in_specs, v1 = _checks.matrix_specs(in_specs, matrix_specs, fn)
    return _checks.tile_size(T_A, fn), in_specs, v1


def _give_up(donate, *arrays):
    """``donate=True`` (eager calls of concrete arrays): the arrays are deleted once the call
    has been dispatched, as jaxmg 1.x's donation leaves them. The compositions do not work in
    their buffers, so this frees them earlier and no more."""
    if donate and not any(_geometry.is_tracer(x) for x in arrays):
        for x in arrays:
            if isinstance(x, jax.Array) and not x.is_deleted():
                x.delete()


def polar(
    A: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    in_specs: Specs | None = None,
    *positional: Any,
    side: Literal["right", "left"] = "right",
    compute_h: bool = True,
    matrix_specs: Specs | None = None,
    return_status: bool = False,
    pad: bool = True,
    donate: bool = False,
    backend: Backend = None,
) -> Result:
    """The polar decomposition of a sharded ``[M, N]`` matrix, as ``scipy.linalg.polar``.

    ``side="right"``: ``A = U P`` with ``P`` ``[N, N]``; ``"left"``: ``A = P U`` with ``P``
    ``[M, M]``; ``U`` is ``[M, N]`` with orthonormal columns (``M >= N``) or rows. ``P`` is
    Hermitian positive semidefinite. ``T_A``, ``mesh``, ``in_specs``, ``return_status`` and
    ``backend`` as for :func:`svd` (the options after ``in_specs`` are keyword-only);
    ``compute_h=False`` returns ``U`` alone; ``matrix_specs``, ``pad`` and ``donate`` are jaxmg
    1.x's (:func:`jaxmg.gesvd`). Returns ``(U, P)`` or ``U`` (and the status), sharded as ``A``
    where the device count divides the sharded dimension.

    From the SVD: ``U = U_s Vh``, ``P = V diag(s) Vh`` (right). Derivatives through the SVD's:
    distinct singular values.
    """
    fn = "jaxmg.polar"
    _checks.keyword_only(fn, positional, "side or return_status, e.g. side='left'")
    T_A, in_specs, v1 = _v1_options(fn, T_A, pad, donate, in_specs, matrix_specs)
    if side not in ("right", "left"):
        raise ValueError(f"{fn}: side must be 'right' or 'left', got {side!r}.")
    compute_h = _checks.flag(compute_h, "compute_h", fn)
    u, p, status, geometry = _polar_of(A, T_A, mesh, in_specs, side, backend, fn)
    _give_up(donate, A)
    if return_status and v1:
        status = _v1_status.vector("polar", status, geometry, shape=A.shape, tile=T_A or 0)
    out = (u, p) if compute_h else (u,)
    out += (status,) if return_status else ()
    return out if len(out) > 1 else out[0]


def lstsq(
    A: jax.Array,
    b: jax.Array,
    rcond: float | None = None,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    in_specs: Specs | None = None,
    *positional: Any,
    return_status: bool = False,
    backend: Backend = None,
) -> Result:
    """The least-squares solution of ``A x = b`` for a sharded ``[M, N]`` ``A``, as
    ``jnp.linalg.lstsq`` (jaxmg 1.x: ``least_squares``): full rank or rank-deficient.

    Args:
      A: as for :func:`svd`.
      b: ``[M]`` or ``[M, K]``, ``A``'s dtype, any sharding (replicated for the solve).
      rcond: singular values below ``rcond * s[0]`` count as zero; ``None`` (default):
        ``ε * max(M, N)``, as ``jnp.linalg.lstsq``.
      T_A, mesh, in_specs, backend, return_status: as for :func:`svd`.

    Returns:
      ``(x, residuals, rank, s)`` as ``jnp.linalg.lstsq``: ``x`` ``[N]`` or ``[N, K]``
      (replicated), the squared residual norm of each column of ``b`` (always computed),
      the numerical rank, the singular values; the status last with ``return_status``.

    The minimum-norm solution through the SVD's pseudo-inverse (with backend ``"mp"`` on CPUs
    ScaLAPACK's ``p?gesvd``, not ``p?gels``, which gives neither ``s`` nor the rank and needs
    full rank: see :func:`gels`); derivatives through the SVD's.
    """
    fn = "jaxmg.lstsq"
    _checks.keyword_only(fn, positional, "return_status or backend, e.g. return_status=True")
    geometry, dtype = _where(A, mesh, in_specs, backend, fn)
    m, n = A.shape
    b_shape = _checks.rhs_shape(b, m, dtype, fn)
    T_A = _checks.tile_size(T_A, fn)
    if rcond is None:
        rcond = float(np.finfo(dtype).eps) * max(m, n)
    elif not _geometry.is_tracer(rcond) and not float(rcond) < 1:
        raise ValueError(
            f"{fn}: rcond={rcond!r} counts every singular value as zero (it is relative to the "
            "largest, so x would be 0); pass rcond < 1, or None. For jaxmg 1.x's "
            "least_squares(A, b, T_A), whose third argument is a tile size, call "
            "jaxmg.least_squares."
        )
    a = _placed(A, geometry.mesh, geometry.spec)
    b2 = _placed(jnp.reshape(b, (m, -1)), geometry.mesh, P(None, None))
    rcond = jnp.asarray(rcond, np.finfo(dtype).dtype)
    x, resid, rank, s, status = _lstsq_call(geometry, T_A, a, b2, rcond)
    if len(b_shape) == 1:
        x, resid = x[:, 0], resid[0]
    out = (x, resid, rank, s)
    return out + (status,) if return_status else out


def qr(
    A: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    in_specs: Specs | None = None,
    *positional: Any,
    mode: Literal["reduced", "r"] = "reduced",
    matrix_specs: Specs | None = None,
    return_status: bool = False,
    pad: bool = True,
    donate: bool = False,
    backend: Backend = None,
) -> Result:
    """The QR decomposition ``A = Q R`` of a sharded ``[M, N]`` matrix.

    Args:
      A: as for :func:`svd`; ``K = min(M, N)`` divisible by the device count, and the first
        ``K`` columns of full rank (``cond`` below about ``1 / ε`` of the dtype). With backend
        ``"mp"`` on CPUs (ScaLAPACK's Householder QR) neither: any ``K``, any rank.
      T_A: with backend ``"mp"`` on CPUs the engine's square tile (default: 64, or the smaller
        side of a block); elsewhere checked and unused (the compositions choose their tiles).
      mode (keyword): ``"reduced"`` (default): ``Q`` ``[M, K]`` with orthonormal columns, ``R``
        ``[K, N]`` upper triangular (trapezoidal for ``M < N``); ``"r"``: ``R`` alone.
      mesh, in_specs, backend, return_status: as for :func:`svd`; the status is the Cholesky
        factorisation's ``k > 0`` when the first ``k`` columns are numerically dependent
        (``Q`` and ``R`` are then NaN). With backend ``"mp"`` on CPUs always 0: dependent
        columns give a valid ``Q R = A`` with orthonormal ``Q`` and a zero (or rounding-level)
        diagonal entry of ``R``.
      matrix_specs, pad, donate: jaxmg 1.x's, as for :func:`jaxmg.gesvd`.

    Returns:
      ``(Q, R)`` or ``R``, and the status with ``return_status``. ``R``'s diagonal is real and
      positive (LAPACK's may be negative: the factorisation is the same up to those signs).

    How: shifted CholeskyQR in four steps (module :mod:`jaxmg._decompositions`), or with
    backend ``"mp"`` on CPUs ScaLAPACK's ``p?geqrf`` + ``p?orgqr`` (``p?ungqr``). Derivatives:
    JAX's rule for ``jnp.linalg.qr`` (``M >= N``; for ``M < N`` through the product ``Q^H A``),
    which needs ``R``'s first ``K`` columns invertible.
    """
    fn = "jaxmg.qr"
    _checks.keyword_only(fn, positional, "mode or return_status, e.g. mode='r'")
    T_A, in_specs, v1 = _v1_options(fn, T_A, pad, donate, in_specs, matrix_specs)
    q, r, status, geometry = _qr_of(A, T_A, mesh, in_specs, mode, backend, fn)
    _give_up(donate, A)
    if return_status and v1:
        status = _v1_status.vector("qr", status, geometry, shape=A.shape, tile=T_A or 0)
    out = (r,) if mode == "r" else (q, r)
    out += (status,) if return_status else ()
    return out if len(out) > 1 else out[0]
