"""What the decompositions (:mod:`jaxmg.decompositions.api`) put between their solver calls.

Where ``A`` lives and what it may be (:func:`_where`), the sharding of a result "like ``A``"
(:func:`_like_a`), and :func:`_glue`: the products, slices and concatenations between two solver
calls, placed by XLA's partitioner (on Explicit axes, inside ``auto_axes``). Also the pieces the
SVD's and the QR's rules share with JAX's own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from ..describe import checks
from ..describe.sharding import _explicit, _placed
from ..engines import locate

_HIGHEST = jax.lax.Precision.HIGHEST


def _mm(a, b):
    return jnp.matmul(a, b, precision=_HIGHEST)


def _h(a):
    return jnp.conj(a).T


def _where(A, mesh, in_specs, backend, caller, engine_routine=None):
    """Checks before any device work: ``A``'s type and shape, the sharding it is solved on.
    ``engine_routine(geometry)`` (default :func:`_native_mp`): whether the caller's routine
    runs on the engine's own routine there, which alone takes a process grid ``P(r, c)``."""
    (spec,) = checks.in_specs(in_specs, caller, ("A",))
    dtype = checks.matrix_dtype(A, caller)
    geometry = locate(A, mesh, spec, backend, caller)
    m, n = A.shape
    if geometry.form == "grid":
        if not (engine_routine or _native_mp)(geometry):
            raise ValueError(
                f"{caller}: A sharded over a process grid P(r, c) runs on the engine's own "
                "routines only (backend 'mp': ScaLAPACK's on CPUs; on GPUs cuSOLVERMp's qr and "
                "gels); the compositions of backend 'mp' on GPUs take A sharded by rows "
                "P(ax, None) or by columns P(None, ax) of one mesh axis."
            )
        rows, cols = geometry.grid
        if m % rows or n % cols:
            raise ValueError(
                f"{caller}: A of shape {(m, n)} is sharded P(r, c) over a {rows}x{cols} process "
                f"grid: M must be divisible by {rows} and N by {cols}."
            )
    else:
        sharded = m if geometry.form == "rows" else n
        if sharded % geometry.ndev:
            raise ValueError(
                f"{caller}: A of shape {(m, n)} is sharded by {geometry.form} over {geometry.ndev} "
                f"devices of axis {geometry.axis!r}, which does not divide {sharded}."
            )
    if min(m, n) == 0:
        raise ValueError(f"{caller}: A must have at least one row and one column, got {(m, n)}.")
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
    """The backend the composed routines ask for: the call's engine, where it can be asked for
    by name (``None`` leaves the choice to them)."""
    return geometry.engine.name if geometry.engine.public else None


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


def _whole(a, geometry):
    """``a`` unsharded on its solver axis of one device (JAX's decompositions take no sharded
    dimension): no data moves."""
    return _placed(a, geometry.mesh, _REPLICATED)


def _finite_status(a, *outputs):
    """``(status, *outputs)`` of JAX's dense decompositions of ``a`` (``M x N``), which return
    NaN where LAPACK would report a failure and give no order: ``min(M, N) + 1`` where ``a`` or
    an output is not finite (as the other engines report for an ``a`` that holds NaN or Inf:
    their decompositions are made of a Hermitian solver of that order), and every output NaN
    then; else 0."""
    finite = jnp.all(jnp.isfinite(a))
    for x in outputs:
        finite = finite & jnp.all(jnp.isfinite(x))
    status = jnp.where(finite, 0, min(a.shape) + 1).astype(jnp.int32)
    return (status, *(jnp.where(finite, x, jnp.full_like(x, jnp.nan)) for x in outputs))


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


def _native_mp(geometry):
    """Whether ScaLAPACK's own p?gesvd, p?geqrf + p?orgqr and p?gels run: backend ``"mp"`` on
    CPUs, the engine that also relays blocks itself. On GPUs the compositions run ``svd``,
    ``polar`` and ``lstsq`` (cusolverMpGesvd came in cuSOLVERMp 0.9.0 and is not bound)."""
    return geometry.engine.relays_blocks(geometry.platform)


def _engine_inverts(geometry):
    """Whether the engine has ``potri``: all but backend ``"mp"`` on GPUs (cuSOLVERMp has no
    inverse)."""
    return geometry.engine.inverts(geometry.platform)


def _engine_qr(geometry):
    """Whether the engine's own QR (and least squares of full rank) runs: backend ``"mp"``,
    ScaLAPACK's p?geqrf + p?orgqr and p?gels on CPUs, cuSOLVERMp's Geqrf + Orgqr and Gels on
    GPUs (in cuSOLVERMp 0.8.0 and later)."""
    return geometry.engine.own_qr


def _svd_specs(geometry, u_shape, vh_shape):
    """Where ``U``, ``s``, ``Vh`` (and their tangents) go: ``U`` and ``Vh`` like ``A``."""
    return _like_a(geometry, u_shape), P(None), _like_a(geometry, vh_shape)


def _transposed(spec):
    return P(spec[1], spec[0])
