"""The public functions on global arrays that factor and solve in one call: potrs, potri, syevd
(the factor objects, ``cho_factor``/``lu_factor``: :mod:`jaxmg.solvers.factors`).

Each checks its arguments in Python before any device work (:func:`_prepare`: the checks of
:mod:`jaxmg.describe.checks`, then where ``A`` lives and which engine solves there,
:func:`jaxmg.engines.locate`, then the call's description, :mod:`jaxmg.describe.call`), places
``A`` (and ``b``) where the call runs, and runs one jitted program: a differentiable call of
:mod:`jaxmg.programs.derivatives`, or, with ``donate=True`` on concrete arrays, the same program
with its arrays donated (below; nothing donated is differentiated). The programs themselves:
:mod:`jaxmg.programs.routines`. The functions called inside a user's ``shard_map``
(``*_no_shardmap``): :mod:`jaxmg.solvers.in_shard_map`.
"""

from __future__ import annotations

import functools
from typing import Any, Literal, overload

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from ..describe import checks, v1_status
from ..describe.call import of_square
from ..describe.checks import AnyMesh, Backend, Relayout, Result, Specs
from ..describe.sharding import _explicit, _placed, check_spec_axes, is_tracer
from ..engines import locate
from ..programs.derivatives import (
    _potri_call,
    _potrs_call,
    _syevd_call,
)
from ..programs.routines import (
    _cho_logdet_program,
    _getrf_program,
    _potrf_program,
    _potrs_program,
    _status,
    _syevd_program,
)

# --- the checks every public function runs --------------------------------------------------------

#: What the first positional argument after ``in_specs`` meant in earlier jaxmg releases.
_POTRS_WAS = (
    "return_status (jaxmg 0.0.2-0.0.9) or cyclic_1d (the original README's jaxmg), e.g. "
    "return_status=True"
)
_POTRI_WAS = _POTRS_WAS
_SYEVD_WAS = "return_eigenvectors (jaxmg 0.0.x), e.g. return_eigenvectors=False"


#: The options every routine of one square matrix takes, passed on as keywords.
_OPTIONS = ("cyclic_1d", "pad", "relayout", "backend")


def _prepare(A, T_A, mesh, spec, cyclic_1d, relayout, pad, caller, routine, backend=None):
    """Validate the arguments and resolve the geometry; returns ``(call, A's dtype)``."""
    T_A, dtype, relayout, n = checks.square_matrix(A, T_A, cyclic_1d, relayout, pad, caller)
    geometry = locate(A, mesh, spec, backend, caller, cyclic=bool(cyclic_1d))
    return of_square(A, n, T_A, cyclic_1d, relayout, pad, geometry, routine, caller), dtype


# --- donate=True ----------------------------------------------------------------------------------

# donate=True (eager calls of concrete arrays): the same programs with A (and b) donated, so
# that the native call's operand aliasing reaches A's own buffer. XLA reuses a donated buffer
# only for an output of its shape, and potrs has none but its factor: the donating potrs returns
# the factor too (in A's buffer), and the caller drops it. Nothing here is differentiated: a
# traced A is never donated (_donating).


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3), donate_argnums=(4, 5))
def _potrs_donated(call, logdet, status, b_shape, a, b):
    x, f, info = _potrs_program(call, a, b.reshape(call.n, -1), with_factor=True)
    value = _cho_logdet_program(call, f) if logdet else None
    return x.reshape(b_shape), value, (info[0] if status else None), f


_potri_donated = jax.jit(_potri_call.__wrapped__, static_argnums=(0, 1), donate_argnums=(2,))
_syevd_donated = jax.jit(_syevd_call.__wrapped__, static_argnums=(0, 1, 2), donate_argnums=(3,))


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=2)
def _syevd_values_donated(call, status, a):
    """Eigenvalues alone with ``A`` donated: the overwritten buffer comes out too (the caller
    drops it), the one output XLA can give ``A``'s buffer to."""
    w, spent, info = _syevd_program(call, a, vectors=False, spent=True)
    return w, spent, (_status(info) if status else None)


# The factor programs with A donated: the factor takes over A's buffer.
_potrf_donated = jax.jit(_potrf_program.__wrapped__, static_argnums=0, donate_argnums=1)
_getrf_donated = jax.jit(_getrf_program.__wrapped__, static_argnums=0, donate_argnums=1)


def _factor_in_a(call) -> bool:
    """Whether potrs with ``A`` donated keeps its factor in ``A``'s buffer (the engine says:
    not JAX's one-device engine, whose status reads ``A`` again after a failed factorisation,
    :func:`jaxmg.engines.dense._cholesky`, so that XLA would copy ``A`` to hand its buffer to
    the factor: one block more than not donating). Where not, ``A`` and ``b`` are given up
    after the call instead."""
    return call.geometry.engine.factors_in_a


def _donating(donate, caller, *arrays) -> bool:
    """Whether this call donates its arrays: ``donate=True`` and every one of them concrete
    (a traced value is no buffer: under ``jit`` donate with ``donate_argnums``)."""
    if not isinstance(donate, bool):
        raise TypeError(f"{caller}: donate must be True or False, got {donate!r}.")
    return donate and not any(is_tracer(x) for x in arrays)


def _consume(given, placed):
    """After a donating call: the caller's array, when it is not the buffer that was donated
    (it was moved to the call's sharding first), is deleted too: ``donate=True`` gives it up."""
    if given is not placed and isinstance(given, jax.Array) and not given.is_deleted():
        given.delete()


# --- potrs, potri, syevd --------------------------------------------------------------------------


# The return arity follows the flags (as ``jnp.linalg.qr``'s follows ``mode``): one overload each.
@overload
def potrs(
    A: jax.Array,
    b: jax.Array,
    T_A: int | None = ...,
    mesh: AnyMesh | None = ...,
    in_specs: Specs | None = ...,
    *,
    return_status: Literal[False] = ...,
    return_logdet: Literal[False] = ...,
    **options: Any,
) -> jax.Array: ...
@overload
def potrs(
    A: jax.Array,
    b: jax.Array,
    T_A: int | None = ...,
    mesh: AnyMesh | None = ...,
    in_specs: Specs | None = ...,
    *,
    return_status: Literal[True],
    return_logdet: Literal[False] = ...,
    **options: Any,
) -> tuple[jax.Array, jax.Array]: ...
@overload
def potrs(
    A: jax.Array,
    b: jax.Array,
    T_A: int | None = ...,
    mesh: AnyMesh | None = ...,
    in_specs: Specs | None = ...,
    *,
    return_status: Literal[False] = ...,
    return_logdet: Literal[True],
    **options: Any,
) -> tuple[jax.Array, jax.Array]: ...
@overload
def potrs(
    A: jax.Array,
    b: jax.Array,
    T_A: int | None = ...,
    mesh: AnyMesh | None = ...,
    in_specs: Specs | None = ...,
    *,
    return_status: Literal[True],
    return_logdet: Literal[True],
    **options: Any,
) -> tuple[jax.Array, jax.Array, jax.Array]: ...


def potrs(
    A: jax.Array,
    b: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    in_specs: Specs | None = None,
    *positional: Any,
    matrix_specs: Specs | None = None,
    return_status: bool = False,
    return_logdet: bool = False,
    cyclic_1d: bool = False,
    pad: bool = True,
    relayout: Relayout = "native",
    backend: Backend = None,
    donate: bool = False,
) -> Result:
    """Solve ``A x = b`` for Hermitian positive definite ``A`` sharded over devices (Cholesky).

    Args:
      A: ``[N, N]`` float32, float64, complex64 or complex128, sharded by columns
        ``P(None, ax)`` or rows ``P(ax, None)`` of one mesh axis (``N`` divisible by its device
        count), or over a process grid ``P(r, c)`` (``backend="mp"``). One triangle is read:
        the lower for columns and grids, the upper for rows.
      b: ``[N]`` or ``[N, nrhs]``, ``A``'s dtype, any sharding.
      T_A: the tile of the block-cyclic layout; ``None`` chooses one.
      mesh, in_specs (``matrix_specs``, jaxmg 1.x's name): where ``A`` is solved; default:
        ``A``'s own mesh and sharding.
      return_status, return_logdet: also return the status, ``log det A``.
      cyclic_1d, pad, relayout, backend, donate: docs/api.md, "The arguments every routine
        shares" (``donate=True`` gives ``A`` and ``b`` up, eager calls only).

    Returns:
      ``x`` with ``b``'s shape, replicated; ``(x, logdet)`` with ``return_logdet``; the status
      last with ``return_status``: int32, 0 on success, ``k > 0`` if the leading minor of order
      ``k`` is not positive definite (``x`` and ``logdet`` are then NaN); 1.x's status vector
      with ``matrix_specs=``. An illegal argument raises before any device work.

    Differentiable in ``A`` and ``b`` as ``X -> f((X + X^H) / 2)`` at ``X = A``; the backward
    pass reuses the forward factor. Runs eagerly, under ``jit``, ``vmap`` and in ``shard_map``
    programs; never gathers ``A`` on one device.
    """
    caller = "jaxmg.potrs"
    specs, v1 = checks.arguments(caller, positional, _POTRS_WAS, in_specs, matrix_specs, ("A", "b"))
    options = dict(cyclic_1d=cyclic_1d, pad=pad, relayout=relayout, backend=backend)
    return _potrs(
        A, b, T_A, mesh, specs, caller, v1, return_status, return_logdet, donate, **options
    )


def _potrs(A, b, T_A, mesh, specs, caller, v1, return_status, return_logdet, donate, **options):
    """:func:`potrs` for the caller ``caller`` (``specs``: checked, one per array), its status
    in 1.x's form when ``v1``."""
    cyclic_1d, pad, relayout, backend = (options[k] for k in _OPTIONS)
    spec_a, spec_b = specs
    call, dtype = _prepare(A, T_A, mesh, spec_a, cyclic_1d, relayout, pad, caller, "potrs", backend)
    geometry, n = call.geometry, call.n
    b_shape = checks.rhs_shape(b, n, dtype, caller)
    if spec_b is not None:
        check_spec_axes(spec_b, geometry.mesh, "in_specs[1] (b)")
    a = _placed(A, geometry.mesh, geometry.spec)
    b_placed = _placed(b, geometry.mesh, P())
    flags = (call, bool(return_logdet), bool(return_status), b_shape)
    if _donating(donate, caller, A, b):
        if _factor_in_a(call):
            x, logdet, status, _ = _potrs_donated(*flags, a, b_placed)
        else:
            x, logdet, status = _potrs_call(*flags, a, b_placed)
            a.delete()
            b_placed.delete()
        _consume(A, a)
        _consume(b, b_placed)
    else:
        x, logdet, status = _potrs_call(*flags, a, b_placed)
    if return_status and v1:
        nrhs = 1 if len(b_shape) == 1 else b_shape[1]
        status = v1_status.vector("potrs", status, geometry, shape=(n, n), tile=call.T_A, nrhs=nrhs)
    out = (x,)
    out += (logdet,) if return_logdet else ()
    out += (status,) if return_status else ()
    return out if len(out) > 1 else out[0]


def potri(
    A: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    in_specs: Specs | None = None,
    *positional: Any,
    return_status: bool = False,
    cyclic_1d: bool = False,
    pad: bool = True,
    relayout: Relayout = "native",
    backend: Backend = None,
    donate: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Invert a Hermitian positive definite ``A`` sharded over devices (Cholesky).

    Args:
      A: ``[N, N]`` float32, float64, complex64 or complex128, sharded over one mesh axis by
        columns ``P(None, ax)`` or by rows ``P(ax, None)``; only one triangle is read (lower for
        column sharding, upper for row sharding).
      T_A, mesh, in_specs, cyclic_1d, pad, relayout, backend, donate: as for :func:`potrs`
        (``in_specs`` is ``spec_A`` or ``(spec_A,)``).
      return_status: also return the status.

    Returns:
      The full Hermitian inverse ``[N, N]``, sharded like ``A`` (as ``in_specs`` says, when
      given; in the block-cyclic layout when ``cyclic_1d``); with ``return_status``,
      ``(inverse, status)``: status an int32 scalar, 0 on success, ``k > 0`` if ``A`` is not
      positive definite (the inverse is then all NaN).

    Memory: the Hermitian fill trades ``N/ndev``-square blocks between pairs of devices, in
    place. With ``donate=True`` (eager calls; ``A`` is deleted), or under ``jax.jit(...,
    donate_argnums=...)`` with ``A`` donated, the inverse takes over ``A``'s buffer
    (row-sharded: ``A``'s block plus two small blocks per device in all).
    """
    caller = "jaxmg.potri"
    (spec_a,), _ = checks.arguments(caller, positional, _POTRI_WAS, in_specs, None, ("A",))
    call, _ = _prepare(A, T_A, mesh, spec_a, cyclic_1d, relayout, pad, caller, "potri", backend)
    geometry = call.geometry
    a = _placed(A, geometry.mesh, geometry.spec)
    donating = _donating(donate, caller, A)
    inv, status = (_potri_donated if donating else _potri_call)(call, bool(return_status), a)
    if donating:
        _consume(A, a)
    return (inv, status) if return_status else inv


@overload
def syevd(
    A: jax.Array,
    T_A: int | None = ...,
    mesh: AnyMesh | None = ...,
    in_specs: Specs | None = ...,
    *,
    return_eigenvectors: Literal[True] = ...,
    return_status: Literal[False] = ...,
    **options: Any,
) -> tuple[jax.Array, jax.Array]: ...
@overload
def syevd(
    A: jax.Array,
    T_A: int | None = ...,
    mesh: AnyMesh | None = ...,
    in_specs: Specs | None = ...,
    *,
    return_eigenvectors: Literal[False],
    return_status: Literal[False] = ...,
    **options: Any,
) -> jax.Array: ...
@overload
def syevd(
    A: jax.Array,
    T_A: int | None = ...,
    mesh: AnyMesh | None = ...,
    in_specs: Specs | None = ...,
    *,
    return_eigenvectors: bool = ...,
    return_status: Literal[True],
    **options: Any,
) -> tuple[jax.Array, ...]: ...


def syevd(
    A: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    in_specs: Specs | None = None,
    *positional: Any,
    matrix_specs: Specs | None = None,
    return_eigenvectors: bool = True,
    return_status: bool = False,
    cyclic_1d: bool = False,
    pad: bool = True,
    relayout: Relayout = "native",
    backend: Backend = None,
    donate: bool = False,
) -> Result:
    """Eigenvalues, and optionally eigenvectors, of a Hermitian ``A`` sharded over devices.

    Args:
      A: ``[N, N]`` float32, float64, complex64 or complex128, sharded over one mesh axis by
        columns ``P(None, ax)`` or by rows ``P(ax, None)``; only one triangle is read (lower for
        column sharding, upper for row sharding).
      T_A, mesh, in_specs, matrix_specs, cyclic_1d, pad, relayout, backend, donate: as for
        :func:`potrs`. On GPUs
        cuSolverMg's syevd accepts tiles up to 1024 columns: a wider ``T_A`` is lowered to 1024
        with a ``UserWarning`` (``T_A=None`` chooses at most 1024 there); not on one device
        with the default ``backend``, where JAX's eigensolver takes ``A`` whole.
      return_eigenvectors: also compute the eigenvectors.
      return_status: also return the status.

    Returns:
      ``w``, ``[N]`` ascending eigenvalues of the real dtype (float32 for float32/complex64),
      replicated; with ``return_eigenvectors``, ``(w, V)`` where the columns of ``V`` (``[N,
      N]``, sharded like ``A``) are the eigenvectors; with ``return_status`` the status (an
      int32 scalar) comes last: 0 on success, ``k > 0`` if the solver did not converge
      (outputs are then NaN; ``N + 1`` from JAX's eigensolver on one device, which gives no
      LAPACK ``info``).

    Memory: with ``donate=True`` (eager calls; ``A`` is deleted) or ``A`` donated to your
    ``jax.jit(..., donate_argnums=...)``, ``V`` takes over ``A``'s buffer (for the values
    alone with ``donate=True``, the solver works in it). Column-sharded
    ``A``: ``V`` goes back transposed (one more block); row-sharded: one
    ``all_to_all`` of ``V`` (two more).
    """
    caller = "jaxmg.syevd"
    specs, v1 = checks.arguments(caller, positional, _SYEVD_WAS, in_specs, matrix_specs, ("A",))
    options = dict(cyclic_1d=cyclic_1d, pad=pad, relayout=relayout, backend=backend)
    return _syevd(
        A, T_A, mesh, specs, caller, v1, return_eigenvectors, return_status, donate, **options
    )


def _syevd(A, T_A, mesh, specs, caller, v1, return_eigenvectors, return_status, donate, **options):
    """:func:`syevd` for the caller ``caller`` (``specs``: checked, one per array), its status
    in 1.x's form when ``v1``."""
    cyclic_1d, pad, relayout, backend = (options[k] for k in _OPTIONS)
    (spec_a,) = specs
    call, _ = _prepare(A, T_A, mesh, spec_a, cyclic_1d, relayout, pad, caller, "syevd", backend)
    geometry = call.geometry
    vectors = bool(return_eigenvectors)
    a = _placed(A, geometry.mesh, geometry.spec)
    donating = _donating(donate, caller, A)
    if donating and not vectors:
        w, spent, status = _syevd_values_donated(call, bool(return_status), a)
        spent.delete()
    else:
        w, v, status = (_syevd_donated if donating else _syevd_call)(
            call, vectors, bool(return_status), a
        )
    if donating:
        _consume(A, a)
    if return_status and v1:
        shape = (call.n, call.n)
        status = v1_status.vector("syevd", status, geometry, shape=shape, tile=call.T_A)
    out = (w, v) if vectors else (w,)
    out += (status,) if return_status else ()
    return out if len(out) > 1 else out[0]


def potri_symmetrize(
    A: jax.Array,
) -> jax.Array:
    """The Hermitian matrix whose upper triangle is ``A``'s (jaxmg 0.0.x): ``triu(A) +
    triu(A, 1)^H``. jaxmg's :func:`potri` and :func:`potri_shardmap_ctx` already return the
    full inverse, which this leaves unchanged; kept for programs written for 0.0.x."""
    upper = jnp.triu(A)
    lower = jnp.conj(jnp.triu(A, 1)).T
    sharding = jax.typeof(upper).sharding
    if isinstance(sharding, NamedSharding) and not sharding.mesh.empty:
        if _explicit(sharding.mesh, sharding.spec):  # the transpose moved the sharded dimension
            lower = jax.sharding.reshard(lower, sharding)
    return upper + lower
