"""The names only jaxmg 1.x has: ``gesvd``, ``least_squares``, the ``*_shardmap_ctx`` functions
on global arrays, and ``device_supports_vmm``.

jaxmg 1.x (cuSOLVERMp) shapes every routine as ``f(a, [b,] T_A, mesh=None, matrix_specs=None,
*, in_specs=None, return_status=False, pad=True, donate=True, ...)``, and gives each a
``*_shardmap_ctx`` twin: the same call on global arrays, never donating, that returns 1.x's
work buffer first (``potrs``, ``syevd``, ``lu_solve``, ``gesvd``, ``least_squares``) and its
status always. Here they run on jaxmg's engines through the public functions of
:mod:`jaxmg.solvers.hermitian` and :mod:`jaxmg.decompositions.api`, with the status in 1.x's form
(:mod:`jaxmg.describe.v1_status`). jaxmg's engines keep their work buffers inside the call, so the
``a_work`` they return is ``A`` itself, unchanged (no copy: a program that keeps it in its
``jit``'s outputs, as 1.x asks for donation, gets ``A``'s buffer back).

``donate`` defaults to ``False`` here and in every jaxmg function, where 1.x's default is
``True``: a 1.x program then keeps ``A`` and ``b`` alive (more memory, never a deleted array),
and ``donate=True`` gives them up as in 1.x. docs/migration.md has the whole table.
"""

from __future__ import annotations

import ctypes
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ..decompositions.api import _give_up, _polar_of, _qr_of, _svd_of, _v1_options
from ..decompositions.engine_routines import _gels_call, _mp_tile
from ..decompositions.glue import _engine_qr, _where
from ..decompositions.svd import _lstsq_call
from ..describe import checks, v1_status
from ..describe.checks import AnyMesh, Backend, Result, Specs
from ..describe.sharding import _placed
from ..solvers import factors, hermitian


def gesvd(
    A: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    in_specs: Specs | None = None,
    *positional: Any,
    matrix_specs: Specs | None = None,
    compute_u: bool = True,
    compute_vh: bool = True,
    full_matrices: bool = False,
    return_status: bool = False,
    pad: bool = True,
    donate: bool = False,
    backend: Backend = None,
) -> Result:
    """jaxmg 1.x's SVD ``A = U diag(s) Vh`` of a sharded ``[M, N]`` matrix (:func:`jaxmg.svd`
    with 1.x's arguments).

    Args:
      A: as for :func:`jaxmg.svd`.
      T_A, mesh, in_specs (``matrix_specs``, 1.x's name), backend: as for :func:`jaxmg.svd`.
      compute_u, compute_vh: return ``U``, ``Vh`` (keyword-only, like all that follows).
      full_matrices: ``U`` ``[M, M]`` and ``Vh`` ``[N, N]`` (default ``False``: ``K = min(M,
        N)`` columns / rows).
      return_status: also return 1.x's status vector (docs/migration.md): word 0 is 0
        on success, 46 when the eigensolver did not converge (outputs NaN), word 34 its info.
      pad: accepted; no effect (no tile padding is allocated).
      donate: ``True`` deletes ``A`` after the call (1.x's default; jaxmg's is ``False``).

    Returns:
      NumPy's order: ``(U, s, Vh)``, ``(U, s)``, ``(s, Vh)`` or ``s``; the status last.
    """
    caller = "jaxmg.gesvd"
    checks.keyword_only(caller, positional, "compute_u (jaxmg 1.x), e.g. compute_u=False")
    T_A, in_specs, _ = _v1_options(caller, T_A, pad, donate, in_specs, matrix_specs)
    compute_u = checks.flag(compute_u, "compute_u", caller)
    compute_vh = checks.flag(compute_vh, "compute_vh", caller)
    full = checks.flag(full_matrices, "full_matrices", caller)
    vectors = compute_u or compute_vh
    u, s, vh, status, geometry = _svd_of(A, full, vectors, T_A, mesh, in_specs, backend, caller)
    _give_up(donate, A)
    out = ((u,) if compute_u else ()) + (s,) + ((vh,) if compute_vh else ())
    if return_status:
        out += (v1_status.vector("gesvd", status, geometry, shape=A.shape, tile=T_A or 0),)
    return out if len(out) > 1 else out[0]


def least_squares(
    A: jax.Array,
    b: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    in_specs: Specs | None = None,
    *positional: Any,
    matrix_specs: Specs | None = None,
    return_status: bool = False,
    pad: bool = True,
    donate: bool = False,
    backend: Backend = None,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """jaxmg 1.x's least-squares solution ``x = argmin ||A x - b||`` of a sharded ``[M, N]``
    ``A`` of full column rank, ``M >= N``.

    Args:
      A: ``[M, N]``, ``M >= N``, as for :func:`jaxmg.svd` (a wide ``A``: :func:`jaxmg.lstsq`).
      b: ``[M]`` or ``[M, K]``, ``A``'s dtype, any sharding (replicated for the solve).
      T_A, mesh, in_specs (``matrix_specs``), backend, pad, donate (``A`` and ``b``): as for
        :func:`gesvd`.
      return_status: also return 1.x's status vector: word 0 is 0 on success, nonzero (word
        27, the routine's info) when it failed (``x`` is then NaN).

    Returns:
      ``x``, ``[N]`` or ``[N, K]``, replicated; the status last with ``return_status``.

    How: backend ``"mp"`` runs ScaLAPACK's ``p?gels`` on CPUs and cuSOLVERMp's ``Gels`` on
    GPUs (as 1.x): an exactly singular triangular factor gives info ``k > 0`` and NaN. Elsewhere the
    SVD's pseudo-inverse of :func:`jaxmg.lstsq` (differentiable): the same ``x`` for full rank;
    for a numerically rank-deficient ``A`` the minimum-norm solution, where ``Gels`` gives a
    large, inaccurate one.
    """
    caller = "jaxmg.least_squares"
    checks.keyword_only(caller, positional, "return_status (jaxmg 1.x), e.g. return_status=True")
    T_A, in_specs, _ = _v1_options(caller, T_A, pad, donate, in_specs, matrix_specs)
    x, status = _least_squares(A, b, T_A, mesh, in_specs, backend, caller)
    _give_up(donate, A, b)
    return (x, status) if return_status else x


def _least_squares(A, b, T_A, mesh, in_specs, backend, caller):
    """``(x, 1.x status)`` of :func:`least_squares`."""
    geometry, dtype = _where(A, mesh, in_specs, backend, caller, _engine_qr)
    m, n = A.shape
    if m < n:
        raise ValueError(
            f"{caller}: A has shape {(m, n)}; least_squares (as jaxmg 1.x's) takes M >= N. For the "
            "minimum-norm solution of a wide A call jaxmg.lstsq."
        )
    b_shape = checks.rhs_shape(b, m, dtype, caller)
    a = _placed(A, geometry.mesh, geometry.spec)
    b2 = _placed(jnp.reshape(b, (m, -1)), geometry.mesh, P(None, None))
    if _engine_qr(geometry):
        x, info = _gels_call(geometry, _mp_tile(geometry, T_A, (m, n)), a, b2)
    else:
        rcond = jnp.asarray(float(np.finfo(dtype).eps) * m, np.finfo(dtype).dtype)
        x, _, _, _, info = _lstsq_call(geometry, T_A, a, b2, rcond)
    x = x[:, 0] if len(b_shape) == 1 else x
    k = 1 if len(b_shape) == 1 else b_shape[1]
    tile = T_A or 0
    return x, v1_status.vector("least_squares", info, geometry, shape=(m, n), tile=tile, nrhs=k)


# --- the *_shardmap_ctx functions on global arrays ------------------------------------------------


def _global_call(caller, mesh, in_specs, matrix_specs, positional, pad, arrays=None):
    """The checks of a ``*_shardmap_ctx`` call on global arrays (jaxmg 1.x's form): its specs,
    one per array named in ``arrays`` (as given without ``arrays``). Outside ``shard_map`` the
    fourth argument is 1.x's ``mesh``; a bool there is jaxmg 0.0.x's ``pad``, which only calls
    inside ``shard_map`` take."""
    checks.keyword_only(caller, positional, "in_specs or pad (jaxmg 1.x), e.g. pad=False")
    if isinstance(mesh, (bool, np.bool_)):
        raise TypeError(
            f"{caller}: called on global arrays (no enclosing jax.shard_map), this is jaxmg 1.x's "
            f"function, whose fourth argument is mesh; got {mesh!r}. jaxmg 0.0.x's "
            "(a, b, T_A, pad) form runs inside jax.shard_map, on local blocks of rows."
        )
    checks.flag(pad, "pad", caller)
    specs = checks.matrix_specs(in_specs, matrix_specs, caller)[0]
    return specs if arrays is None else checks.in_specs(specs, caller, arrays)


def potrs_global(
    a: jax.Array,
    b: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    matrix_specs: Specs | None = None,
    *positional: Any,
    in_specs: Specs | None = None,
    return_logdet: bool = False,
    pad: bool = True,
    backend: Backend = None,
) -> Result:
    """jaxmg 1.x's ``potrs_shardmap_ctx``: :func:`jaxmg.potrs` on global arrays, ``a`` and
    ``b`` kept; returns ``(a_work, x, status)`` or ``(a_work, x, logdet, status)``."""
    caller = "jaxmg.potrs_shardmap_ctx"
    specs = _global_call(caller, mesh, in_specs, matrix_specs, positional, pad, ("A", "b"))
    options = dict(cyclic_1d=False, pad=pad, relayout="native", backend=backend)
    out = hermitian._potrs(
        a, b, T_A, mesh, specs, caller, True, True, return_logdet, False, **options
    )
    return (a, *out)


def syevd_global(
    a: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    matrix_specs: Specs | None = None,
    *positional: Any,
    in_specs: Specs | None = None,
    return_eigenvectors: bool = True,
    pad: bool = True,
    backend: Backend = None,
) -> Result:
    """jaxmg 1.x's ``syevd_shardmap_ctx``: :func:`jaxmg.syevd` on global arrays, ``a`` kept;
    returns ``(a_work, w, V, status)`` or ``(a_work, w, status)``."""
    caller = "jaxmg.syevd_shardmap_ctx"
    specs = _global_call(caller, mesh, in_specs, matrix_specs, positional, pad, ("A",))
    options = dict(cyclic_1d=False, pad=pad, relayout="native", backend=backend)
    vectors = checks.flag(return_eigenvectors, "return_eigenvectors", caller)
    out = hermitian._syevd(a, T_A, mesh, specs, caller, True, vectors, True, False, **options)
    return (a, *out)


def lu_solve_shardmap_ctx(
    a: jax.Array,
    b: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    matrix_specs: Specs | None = None,
    *positional: Any,
    in_specs: Specs | None = None,
    pad: bool = True,
    backend: Backend = None,
) -> Result:
    """jaxmg 1.x's ``lu_solve_shardmap_ctx``: :func:`jaxmg.lu_solve` on global arrays, ``a``
    and ``b`` kept; returns ``(a_work, x, status)`` (``a_work`` is ``a``)."""
    caller = "jaxmg.lu_solve_shardmap_ctx"
    specs = _global_call(caller, mesh, in_specs, matrix_specs, positional, pad, ("A", "b"))
    options = dict(cyclic_1d=False, pad=pad, relayout="native", backend=backend)
    x, status = factors._lu_solve(a, b, T_A, mesh, specs, caller, True, 0, True, False, **options)
    return a, x, status


def least_squares_shardmap_ctx(
    a: jax.Array,
    b: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    matrix_specs: Specs | None = None,
    *positional: Any,
    in_specs: Specs | None = None,
    pad: bool = True,
    backend: Backend = None,
) -> Result:
    """jaxmg 1.x's ``least_squares_shardmap_ctx``: :func:`least_squares` on global arrays,
    ``a`` and ``b`` kept; returns ``(a_work, b_work, x, status)``: ``a_work`` is ``a``, and
    ``b_work`` has ``b``'s shape with ``x`` in its first ``N`` rows (1.x's contract), zeros
    below."""
    caller = "jaxmg.least_squares_shardmap_ctx"
    specs = _global_call(caller, mesh, in_specs, matrix_specs, positional, pad)
    x, status = _least_squares(a, b, checks.tile_size(T_A, caller), mesh, specs, backend, caller)
    rows = a.shape[0] - a.shape[1]
    b_work = jnp.concatenate([x, jnp.zeros((rows, *x.shape[1:]), x.dtype)], axis=0)
    return a, b_work, x, status


def qr_shardmap_ctx(
    a: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    matrix_specs: Specs | None = None,
    *positional: Any,
    in_specs: Specs | None = None,
    pad: bool = True,
    backend: Backend = None,
) -> Result:
    """jaxmg 1.x's ``qr_shardmap_ctx``: :func:`jaxmg.qr` on global arrays, ``a`` kept; returns
    ``(Q, R, status)`` (as 1.x's, no work buffer)."""
    caller = "jaxmg.qr_shardmap_ctx"
    specs = _global_call(caller, mesh, in_specs, matrix_specs, positional, pad)
    T_A = checks.tile_size(T_A, caller)
    q, r, info, geometry = _qr_of(a, T_A, mesh, specs, "reduced", backend, caller)
    return q, r, v1_status.vector("qr", info, geometry, shape=a.shape, tile=T_A or 0)


def polar_shardmap_ctx(
    a: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    matrix_specs: Specs | None = None,
    *positional: Any,
    in_specs: Specs | None = None,
    compute_h: bool = True,
    pad: bool = True,
    backend: Backend = None,
) -> Result:
    """jaxmg 1.x's ``polar_shardmap_ctx``: :func:`jaxmg.polar` on global arrays, ``a`` kept;
    returns ``(U, H, status)`` or ``(U, status)`` (as 1.x's, no work buffer)."""
    caller = "jaxmg.polar_shardmap_ctx"
    specs = _global_call(caller, mesh, in_specs, matrix_specs, positional, pad)
    T_A = checks.tile_size(T_A, caller)
    compute_h = checks.flag(compute_h, "compute_h", caller)
    u, h, info, geometry = _polar_of(a, T_A, mesh, specs, "right", backend, caller)
    status = v1_status.vector("polar", info, geometry, shape=a.shape, tile=T_A or 0)
    return (u, h, status) if compute_h else (u, status)


def gesvd_shardmap_ctx(
    a: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    matrix_specs: Specs | None = None,
    *positional: Any,
    in_specs: Specs | None = None,
    compute_u: bool = True,
    compute_vh: bool = True,
    full_matrices: bool = False,
    pad: bool = True,
    backend: Backend = None,
) -> Result:
    """jaxmg 1.x's ``gesvd_shardmap_ctx``: :func:`gesvd` on global arrays, ``a`` kept; returns
    ``(a_work, U, s, Vh, status)``, without ``U`` or ``Vh`` when not computed (``a_work`` is
    ``a``)."""
    caller = "jaxmg.gesvd_shardmap_ctx"
    specs = _global_call(caller, mesh, in_specs, matrix_specs, positional, pad)
    out = gesvd(
        a,
        T_A,
        mesh,
        specs,
        compute_u=compute_u,
        compute_vh=compute_vh,
        full_matrices=full_matrices,
        return_status=True,
        backend=backend,
    )
    return (a, *out)


# --- devices --------------------------------------------------------------------------------------

#: ``CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`` in CUDA's ``cuda.h``.
_VMM_SUPPORTED = 102


def device_supports_vmm(device: int = 0) -> bool:
    """Whether CUDA device ``device`` (an ordinal) supports virtual memory management, which
    XLA's ``vmm`` GPU allocator needs (jaxmg 1.x's function). It asks the CUDA driver
    (``libcuda.so.1``) directly, without JAX, so it may be called before JAX starts its GPU
    backend.

    Raises:
      RuntimeError: no CUDA driver here, no such device, or a driver call failed.
    """
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        raise RuntimeError(
            "jaxmg.device_supports_vmm: the CUDA driver (libcuda.so.1) is not available here, "
            "so no CUDA device can be asked."
        ) from error
    handle, value = ctypes.c_int(), ctypes.c_int()
    for call, args in (
        ("cuInit", (0,)),
        ("cuDeviceGet", (ctypes.byref(handle), int(device))),
        ("cuDeviceGetAttribute", (ctypes.byref(value), _VMM_SUPPORTED, handle)),
    ):
        result = getattr(cuda, call)(*args)
        if result != 0:
            raise RuntimeError(
                f"jaxmg.device_supports_vmm: {call} failed with CUDA error {result} (device "
                f"{device})."
            )
    return bool(value.value)
