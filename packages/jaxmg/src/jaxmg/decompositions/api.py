"""svd, polar, lstsq and qr of a sharded matrix: the public functions, their checks and
jaxmg 1.x's options.

Neither cuSolverMg nor its LAPACK twin has an SVD or a QR, so these are built from what the engines
do run, with sharded products between the calls, on every backend and platform the routines they
call run on: the SVD (and ``polar``, ``lstsq``) from QDWH's polar decomposition
(:mod:`jaxmg.decompositions.qdwh`) or the Jordan-Wielandt eigenproblem
(:mod:`jaxmg.decompositions.svd`), QR by shifted CholeskyQR (:mod:`jaxmg.decompositions.qr`), the
glue between solver calls in :mod:`jaxmg.decompositions.glue`. Backend ``"mp"`` runs the engine's
own routines instead (:mod:`jaxmg.decompositions.engine_routines`: ScaLAPACK's on CPUs; on GPUs
cuSOLVERMp's, for ``qr`` alone; ``lstsq`` stays on the SVD because its contract, ``s``, the
numerical rank and ``rcond``, is more than ``p?gels`` gives). On a solver axis of one device with
the default backend they are JAX's own (``jnp.linalg.svd``, ``qr``, ``lstsq``,
``jax.scipy.linalg.polar``), with JAX's derivatives.
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ..describe import checks, v1_status
from ..describe.checks import AnyMesh, Backend, Result, Specs
from ..describe.sharding import _placed, is_tracer
from ..solvers import hermitian
from .glue import (
    _engine_qr,
    _where,
)
from .qr import _qr_call
from .svd import _lstsq_call, _polar_call, _svd_call


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

    How (docs/api.md): for ``M >= N`` with ``N`` divisible by the devices
    (``full_matrices=False``), the polar decomposition by QDWH and the eigenpairs of its
    Hermitian factor; otherwise the eigenvectors of ``[[0, A], [A^H, 0]]``; with backend
    ``"mp"`` on CPUs ScaLAPACK's ``p?gesvd`` (``full_matrices=False``);
    singular values to ``O(ε ||A||)`` whatever the condition number. Singular vectors of
    singular values below ``ε ||A||`` (a rank-deficient ``A``) are not determined and need not
    be orthonormal. Derivatives (``full_matrices=False``): JAX's rule for distinct singular
    values.
    """
    caller = "jaxmg.svd"
    checks.keyword_only(caller, positional, "return_status or backend, e.g. return_status=True")
    T_A = checks.tile_size(T_A, caller)
    u, s, vh, status, _ = _svd_of(
        A, bool(full_matrices), bool(compute_uv), T_A, mesh, in_specs, backend, caller
    )
    out = (u, s, vh) if compute_uv else (s,)
    out += (status,) if return_status else ()
    return out if len(out) > 1 else out[0]


def _svd_of(A, full, compute_uv, T_A, mesh, in_specs, backend, caller):
    """:func:`svd`'s checks and call: ``(U, s, Vh, status, geometry)``."""
    geometry, _ = _where(A, mesh, in_specs, backend, caller)
    if full and geometry.form == "grid":
        raise ValueError(
            f"{caller}: full_matrices=True runs through the Jordan-Wielandt composition, which "
            "takes A sharded by rows P(ax, None) or by columns P(None, ax), not P(r, c); "
            "p?gesvd runs with full_matrices=False."
        )
    a = _placed(A, geometry.mesh, geometry.spec)
    return (*_svd_call(geometry, T_A, full, compute_uv, a), geometry)


def _polar_of(A, T_A, mesh, in_specs, side, backend, caller):
    """:func:`polar`'s call: ``(U, P, status, geometry)``."""
    geometry, _ = _where(A, mesh, in_specs, backend, caller)
    a = _placed(A, geometry.mesh, geometry.spec)
    return (*_polar_call(geometry, T_A, side, a), geometry)


def _qr_of(A, T_A, mesh, in_specs, mode, backend, caller):
    """:func:`qr`'s checks and call: ``(Q or None, R, status, geometry)``."""
    if mode not in ("reduced", "r"):
        raise ValueError(f"{caller}: mode must be 'reduced' or 'r', got {mode!r}.")
    geometry, _ = _where(A, mesh, in_specs, backend, caller, _engine_qr)
    k = min(A.shape)
    if not geometry.engine.whole and not _engine_qr(geometry) and k % geometry.ndev:
        raise ValueError(
            f"{caller}: min(M, N) = {k} must be divisible by the {geometry.ndev} devices of axis "
            f"{geometry.axis!r} (the Gram matrix of the first {k} columns is factored by "
            "jaxmg.cho_factor over them)."
        )
    a = _placed(A, geometry.mesh, geometry.spec)
    return (*_qr_call(geometry, mode, T_A, a), geometry)


def _v1_options(caller, T_A, pad, donate, in_specs, matrix_specs):
    """The options jaxmg 1.x's form adds, checked: ``(T_A, in_specs, v1)`` (``v1``: the call
    named ``matrix_specs=``). ``pad`` has no effect on the compositions (they pad no tiles);
    ``donate`` is checked here and acted on by :func:`_give_up`."""
    if isinstance(T_A, str):
        raise TypeError(
            f"{caller}: T_A (the second positional argument, as in jaxmg 1.x) is a tile size, got "
            f"{T_A!r}; pass numpy-style options by name, e.g. mode='r' or side='left'."
        )
    checks.flag(pad, "pad", caller)
    checks.flag(donate, "donate", caller)
    in_specs, v1 = checks.matrix_specs(in_specs, matrix_specs, caller)
    return checks.tile_size(T_A, caller), in_specs, v1


def _give_up(donate, *arrays):
    """``donate=True`` (eager calls of concrete arrays): the arrays are deleted once the call
    has been dispatched, as jaxmg 1.x's donation leaves them. The compositions do not work in
    their buffers, so this frees them earlier and no more."""
    if hermitian._donating(donate, "jaxmg", *arrays):
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

    From the SVD (:func:`svd`'s routes): ``U = U_s Vh``, ``P = V diag(s) Vh`` (right).
    Derivatives through the SVD's: distinct singular values.
    """
    caller = "jaxmg.polar"
    checks.keyword_only(caller, positional, "side or return_status, e.g. side='left'")
    T_A, in_specs, v1 = _v1_options(caller, T_A, pad, donate, in_specs, matrix_specs)
    if side not in ("right", "left"):
        raise ValueError(f"{caller}: side must be 'right' or 'left', got {side!r}.")
    compute_h = checks.flag(compute_h, "compute_h", caller)
    u, p, status, geometry = _polar_of(A, T_A, mesh, in_specs, side, backend, caller)
    _give_up(donate, A)
    if return_status and v1:
        status = v1_status.vector("polar", status, geometry, shape=A.shape, tile=T_A or 0)
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
    caller = "jaxmg.lstsq"
    checks.keyword_only(caller, positional, "return_status or backend, e.g. return_status=True")
    geometry, dtype = _where(A, mesh, in_specs, backend, caller)
    m, n = A.shape
    b_shape = checks.rhs_shape(b, m, dtype, caller)
    T_A = checks.tile_size(T_A, caller)
    if rcond is None:
        rcond = float(np.finfo(dtype).eps) * max(m, n)
    elif not is_tracer(rcond) and not float(rcond) < 1:
        raise ValueError(
            f"{caller}: rcond={rcond!r} counts every singular value as zero (it is relative to the "
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
        ``"mp"`` (the engine's Householder QR) neither: any ``K``, any rank.
      T_A: with backend ``"mp"`` the engine's square tile (default: 64, or the smaller side of
        a block; on GPUs at most that side); elsewhere checked and unused (the compositions
        choose their tiles).
      mode (keyword): ``"reduced"`` (default): ``Q`` ``[M, K]`` with orthonormal columns, ``R``
        ``[K, N]`` upper triangular (trapezoidal for ``M < N``); ``"r"``: ``R`` alone.
      mesh, in_specs, backend, return_status: as for :func:`svd`; the status is the Cholesky
        factorisation's ``k > 0`` when the first ``k`` columns are numerically dependent
        (``Q`` and ``R`` are then NaN). With backend ``"mp"`` always 0: dependent
        columns give a valid ``Q R = A`` with orthonormal ``Q`` and a zero (or rounding-level)
        diagonal entry of ``R``.
      matrix_specs, pad, donate: jaxmg 1.x's, as for :func:`jaxmg.gesvd`.

    Returns:
      ``(Q, R)`` or ``R``, and the status with ``return_status``. ``R``'s diagonal is real and
      positive (LAPACK's may be negative: the factorisation is the same up to those signs).

    How: shifted CholeskyQR in four steps (docs/api.md), or with backend ``"mp"`` ScaLAPACK's
    ``p?geqrf`` + ``p?orgqr`` (``p?ungqr``) on CPUs, cuSOLVERMp's Geqrf + Orgqr on GPUs.
    Derivatives: JAX's rule for ``jnp.linalg.qr`` (``M >= N``; for ``M < N`` through the
    product ``Q^H A``), which needs ``R``'s first ``K`` columns invertible.
    """
    caller = "jaxmg.qr"
    checks.keyword_only(caller, positional, "mode or return_status, e.g. mode='r'")
    T_A, in_specs, v1 = _v1_options(caller, T_A, pad, donate, in_specs, matrix_specs)
    q, r, status, geometry = _qr_of(A, T_A, mesh, in_specs, mode, backend, caller)
    _give_up(donate, A)
    if return_status and v1:
        status = v1_status.vector("qr", status, geometry, shape=A.shape, tile=T_A or 0)
    out = (r,) if mode == "r" else (q, r)
    out += (status,) if return_status else ()
    return out if len(out) > 1 else out[0]
