"""The public functions of a factor computed once and reused: cho_factor/cho_solve and
lu_factor/lu_solve (``lu_solve`` also factors a matrix it is given, as jaxmg 1.x's does).

Each checks its arguments as :mod:`jaxmg.solvers.hermitian`'s functions do
(:func:`jaxmg.solvers.hermitian._prepare`), and returns or takes a :class:`jaxmg.CholeskyFactor` /
:class:`jaxmg.LUFactor`, whose solves and derivatives reuse the factor
(:mod:`jaxmg.programs.derivatives`).
"""

from __future__ import annotations

from typing import Any

import jax

from ..describe import checks, v1_status
from ..describe.checks import AnyMesh, Backend, Relayout, Specs
from ..describe.sharding import _placed
from ..programs.derivatives import CholeskyFactor, LUFactor, _cho_solve_call, _lu_solve_call
from ..programs.routines import _getrf_program, _potrf_program, _status
from .hermitian import _consume, _donating, _getrf_donated, _potrf_donated, _prepare

#: What the first positional argument after ``in_specs`` of a factorisation meant before.
_FACTOR_WAS = "cyclic_1d, pad or relayout, e.g. relayout='jax'"


def cho_factor(
    A: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    in_specs: Specs | None = None,
    *positional: Any,
    cyclic_1d: bool = False,
    pad: bool = True,
    relayout: Relayout = "native",
    backend: Backend = None,
    donate: bool = False,
) -> CholeskyFactor:
    """Cholesky-factor a Hermitian positive definite ``A`` sharded over devices, for reuse.

    Args:
      A, T_A, mesh, in_specs, cyclic_1d, pad, relayout, backend: as for :func:`jaxmg.potrs`
        (``in_specs`` is ``spec_A`` or ``(spec_A,)``). Only one triangle is read: the lower one
        for column sharding, the upper one for row sharding.

      donate: give ``A`` up (eager calls): the factor takes over ``A``'s buffer and ``A`` is
        deleted; as for :func:`jaxmg.potrs` (no effect under a trace).

    Returns:
      A :class:`CholeskyFactor`: pass it to :func:`jaxmg.cho_solve` any number of times; its
      ``logdet`` and ``status`` are there too. Runs eagerly and under ``jax.jit``; derivatives
      with respect to ``A`` flow through every solve and ``logdet`` made from it.
    """
    caller = "jaxmg.cho_factor"
    (spec_a,), _ = checks.arguments(caller, positional, _FACTOR_WAS, in_specs, None, ("A",))
    call, _ = _prepare(A, T_A, mesh, spec_a, cyclic_1d, relayout, pad, caller, "potrs", backend)
    a = _placed(A, call.geometry.mesh, call.geometry.spec)
    if _donating(donate, caller, A):
        f, status = _potrf_donated(call, a)
        _consume(A, a)
        return CholeskyFactor(f, None, _status(status), call)
    f, status = _potrf_program(call, jax.lax.stop_gradient(a))
    return CholeskyFactor(f, a, _status(status), call)


def _solve_shape(factor, b, caller):
    call = factor._call
    return checks.rhs_shape(b, call.n, factor.factor.dtype, caller)


def cho_solve(
    factor: CholeskyFactor,
    b: jax.Array,
    *positional: Any,
    return_status: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Solve ``A x = b`` with a :class:`CholeskyFactor` of ``A`` (no refactorisation).

    Args:
      factor: from :func:`jaxmg.cho_factor`.
      b: ``[N]`` or ``[N, nrhs]``, ``A``'s dtype, any sharding (replicated for the solve).
      return_status: also return the factor's status.

    Returns:
      ``x`` with ``b``'s shape, replicated (NaN if the factorisation failed); with
      ``return_status``, ``(x, status)``. Differentiable in ``b`` and, through the factor, in
      ``A``: the derivative costs one more solve with the same factor.
    """
    caller = "jaxmg.cho_solve"
    checks.global_arrays(caller)
    checks.keyword_only(caller, positional, "return_status, e.g. return_status=True")
    if not isinstance(factor, CholeskyFactor):
        raise TypeError(
            f"{caller}: factor must be the CholeskyFactor of jaxmg.cho_factor(A), got "
            f"{type(factor).__name__}."
        )
    shape = _solve_shape(factor, b, caller)
    call = factor._call
    x = _cho_solve_call(call, shape, factor.factor, factor.matrix, b)
    return (x, factor.status) if return_status else x


def lu_factor(
    A: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    in_specs: Specs | None = None,
    *positional: Any,
    cyclic_1d: bool = False,
    pad: bool = True,
    relayout: Relayout = "native",
    backend: Backend = None,
    donate: bool = False,
) -> LUFactor:
    """LU-factor (partial pivoting) a general square ``A`` sharded over devices, for reuse.

    Args:
      A: ``[N, N]`` float32, float64, complex64 or complex128, sharded over one mesh axis by
        columns ``P(None, ax)`` or by rows ``P(ax, None)``; the whole matrix is read. Sharded by
        rows, it is transposed first (one ``all_to_all``, a block of temporaries) so that the
        factor, its pivots and its status are ``A``'s in both forms.
      T_A, mesh, in_specs, cyclic_1d, pad, relayout, backend: as for :func:`jaxmg.potrs`. On
        GPUs cuSolverMg's getrf accepts tiles of at most 512 columns: a wider ``T_A`` is
        lowered to 512 with a ``UserWarning`` (``T_A=None`` chooses at most 512 there).
      donate: give ``A`` up (eager calls): the factor takes over ``A``'s buffer and ``A`` is
        deleted; as for :func:`jaxmg.potrs` (no effect under a trace).

    Returns:
      An :class:`LUFactor` for :func:`jaxmg.lu_solve`.
    """
    caller = "jaxmg.lu_factor"
    (spec_a,), _ = checks.arguments(caller, positional, _FACTOR_WAS, in_specs, None, ("A",))
    call, _ = _prepare(A, T_A, mesh, spec_a, cyclic_1d, relayout, pad, caller, "getrf", backend)
    a = _placed(A, call.geometry.mesh, call.geometry.spec)
    if _donating(donate, caller, A):
        lu, pivots, status = _getrf_donated(call, a)
        _consume(A, a)
        return LUFactor(lu, pivots, None, _status(status), call)
    lu, pivots, status = _getrf_program(call, jax.lax.stop_gradient(a))
    return LUFactor(lu, pivots, a, _status(status), call)


_TRANS = {0: "N", 1: "T", 2: "C", "N": "N", "T": "T", "C": "C"}


def lu_solve(
    A: jax.Array | LUFactor,
    b: jax.Array,
    T_A: int | None = None,
    mesh: AnyMesh | None = None,
    in_specs: Specs | None = None,
    *positional: Any,
    matrix_specs: Specs | None = None,
    trans: int | str = 0,
    return_status: bool = False,
    cyclic_1d: bool = False,
    pad: bool = True,
    relayout: Relayout = "native",
    backend: Backend = None,
    donate: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Solve ``A x = b`` for a general square ``A`` sharded over devices (LU, partial pivoting).

    ``A`` is either the matrix (factored by this call, as jaxmg 1.4.1's ``lu_solve``) or an
    :class:`LUFactor` of :func:`jaxmg.lu_factor` (no refactorisation; ``T_A``, ``mesh``,
    ``in_specs``, ``cyclic_1d``, ``pad``, ``relayout`` and ``backend`` then come from the
    factor).

    Args:
      A: ``[N, N]`` as for :func:`jaxmg.lu_factor`, or an :class:`LUFactor`.
      b: ``[N]`` or ``[N, nrhs]``, ``A``'s dtype, any sharding (replicated for the solve).
      trans: ``0``/``"N"``: solve ``A x = b``; ``1``/``"T"``: ``A^T x = b``; ``2``/``"C"``:
        ``A^H x = b`` (scipy's ``lu_solve`` convention). With backend ``"mg"``, whose engine
        solves only with its factor (cuSolverMg's getrs takes ``CUBLAS_OP_N`` alone), ``1`` and
        ``2`` first build the factor of ``A^T`` from ``A``'s, without refactoring: one
        ``all_to_all`` of the factor and two more blocks of its size, transiently, per solve.
      return_status: also return the status: 0, or ``k > 0`` when ``U[k-1, k-1]`` is exactly
        zero (``x`` is then NaN).
      T_A, mesh, in_specs, matrix_specs, cyclic_1d, pad, relayout, backend: as for
        :func:`jaxmg.potrs`.
      donate: with a matrix ``A``, give it up (eager calls): it is factored in its own buffer
        and deleted (not for an :class:`LUFactor`, which is factored already).

    Returns:
      ``x`` with ``b``'s shape, replicated; with ``return_status``, ``(x, status)``.
      Differentiable in ``A`` and ``b``; the derivative reuses the factor.
    """
    caller = "jaxmg.lu_solve"
    was = "trans or return_status, e.g. return_status=True"
    specs, v1 = checks.arguments(caller, positional, was, in_specs, matrix_specs, ("A", "b"))
    options = dict(cyclic_1d=cyclic_1d, pad=pad, relayout=relayout, backend=backend)
    return _lu_solve(A, b, T_A, mesh, specs, caller, v1, trans, return_status, donate, **options)


def _lu_solve(A, b, T_A, mesh, specs, caller, v1, trans, return_status, donate, **options):
    """:func:`lu_solve` for the caller ``caller`` (``specs``: checked, one per array), its
    status in 1.x's form when ``v1``."""
    if trans not in _TRANS:
        raise ValueError(f"{caller}: trans must be 0, 1, 2, 'N', 'T' or 'C', got {trans!r}.")
    if isinstance(A, LUFactor):
        if _donating(donate, caller):
            raise ValueError(
                f"{caller}: donate=True gives A's buffer to its factor, and this A is an LUFactor "
                "already: donate the matrix in lu_factor(A, donate=True) instead."
            )
        factor = A
    else:
        factor = lu_factor(A, T_A, mesh, specs[0], donate=donate, **options)
    shape = _solve_shape(factor, b, caller)
    call = factor._call
    x = _lu_solve_call(call, _TRANS[trans], shape, factor.factor, factor.pivots, factor.matrix, b)
    if not return_status:
        return x
    status = factor.status
    if v1:
        nrhs = 1 if len(shape) == 1 else shape[1]
        dims = (call.n, call.n)
        status = v1_status.vector(
            "lu_solve", status, call.geometry, shape=dims, tile=call.T_A, nrhs=nrhs
        )
    return x, status
