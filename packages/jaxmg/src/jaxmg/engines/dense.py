"""Backend ``"jax"``: JAX's own dense solvers behind the native engine's wrappers.

On a solver axis of one device there is nothing to distribute, and cuSolverMg (or its LAPACK
twin) only adds its fixed cost and its tile limits to what one device's dense solver does
(docs/performance.md has the measurements). So when ``backend=None`` and the solver axis holds
one device (:func:`jaxmg.engines.choose`), the shard_map programs
(:mod:`jaxmg.programs`) call these wrappers instead of the native ones:
XLA's own LAPACK calls on CPUs, cuSOLVER's dense routines on GPUs. Everything above the engine
(the programs, the factor objects, the log-determinant, every derivative rule) is unchanged.

The operand contract is the native engine's (``jaxmg_cuda._ops``, packages/jaxmg-cuda/README.md)
for one device whose one tile is the whole matrix (``T_A = N``, no padding, no moves):

- ``a`` ``[N, N]`` is the column-major storage of the matrix ``M`` the solver sees: ``M =
  a.T``. Only the lower triangle of ``M`` is read (potrf, potrs, potri, syevd); getrf reads
  all of it. Results that replace ``a`` are stored the same way: the factor ``L`` (potrf,
  potrs) as ``L.T``, so that a factor's rows are the storage of ``L``.
- ``b`` and ``x`` are ``[nrhs, N]``, the storage of ``B`` (``N x nrhs``).
- ``status`` is int32 ``[1]``: LAPACK's ``info``. potrf, potrs, potri: the order ``k`` of the
  first leading minor that is not positive definite. JAX's Cholesky gives an all-NaN factor
  and no order, so ``k`` is found only when the factor failed, by bisection over the leading
  minors (:func:`_cholesky`; ``ceil(log2 N)`` Cholesky factorisations, zero on
  success). getrf: ``k`` where ``U[k-1, k-1]`` is the first exact zero of ``U``'s diagonal,
  with LAPACK's 1-based ``ipiv`` as int32 ``[N]``. syevd: ``N + 1`` when the eigensolver
  failed (JAX reports no ``info``; the outputs are then NaN), as jaxmg reports a failure whose
  order it cannot know. The factored solves and inverses return 0.
- Every floating output is NaN where ``status != 0`` (pivots excepted).

XLA gives its LAPACK and cuSOLVER calls column-major operands, so ``M = a.T`` costs no copy:
the transposes here are layout changes that XLA folds into the calls (as in JAX's own
``cho_factor``, which copies a row-major ``A`` into column-major order once, as this does for a
column-sharded ``A``).

Eigenvalues alone: on CPUs JAX's ``eigvalsh`` computes the eigenvectors too (its LAPACK call
always asks for them); here ``M`` is reduced to tridiagonal form (``lax.linalg.tridiagonal``,
LAPACK's ``?sytrd``/``?hetrd``) and its eigenvalues found by bisection
(``jax.scipy.linalg.eigh_tridiagonal``): half of ``eigvalsh``'s time at N = 1024 and 2048
(benchmarks/results/cpu_one_device.md), though slower than the twin's values-only ``?syevd``
(0.36 of it). On GPUs, ``lax.linalg.eigh`` (cuSOLVER's syevd): what ``eigvalsh`` runs there.
JAX has no ``?potri`` either: the inverse is two triangular solves with the factor, as fast
as ``jnp.linalg.inv`` and slower than the twin's LAPACK ``?potri`` (0.5-0.6 of ``inv``) on
CPUs, where ``backend="mg"`` is the faster choice for ``potri`` and eigenvalues alone.

Under ``jax.vmap`` these are JAX's batched solvers (the native engine solves a batch one matrix
after another).

On GPUs this engine is the same JAX programs, lowered to JAX's own cuSOLVER calls
(``cho_factor`` + ``cho_solve``, ``eigh`` and ``solve``); CI checks their lowering for CUDA
only where jaxlib can (what has run on GPUs: docs/gpu.md).
"""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
from jax import lax

from ..describe import processes
from .base import Engine


def _matrix(storage):
    """The matrix whose column-major storage is the local array ``storage`` (``[N, N]``)."""
    if storage.ndim != 2 or storage.shape[0] != storage.shape[1]:
        raise ValueError(
            "the one-device engine takes the whole matrix as one tile: a local array [N, N], "
            f"got {tuple(storage.shape)} (jaxmg bug: backend 'jax' runs with T_A = N)"
        )
    return storage.T


def _no_moves(moves):
    if moves is not None and any(len(table) for table in moves):
        raise ValueError("the one-device engine takes no relayout moves (jaxmg bug)")


def _replicated(x):
    """``x``, typed as the same on every device of the solver's axis, as the native engines'
    results of that kind (``x``, ``w``, the status) are: inside a user's ``shard_map`` that
    checks replication (``check_vma=True``) a result computed from the local block varies over
    the block's axes, and ``out_specs=P()`` would be refused. The solver's axis holds one
    device: a sum over it (over every axis of one device ``x`` varies over) changes nothing.
    jaxmg's own programs do not check replication: there ``x`` varies over no axis."""
    axes = tuple(name for name in _varying_axes(x) if lax.axis_size(name) == 1)
    return lax.psum(x, axes) if axes else x


def _varying_axes(x) -> frozenset:
    """The manual mesh axes ``x`` is typed as varying over (``jax.typeof(x)``: its manual axis
    type's ``varying`` from jax 0.10, ``vma`` before)."""
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)
    return frozenset(getattr(mat, "varying", ()) if mat is not None else getattr(aval, "vma", ()))


def _varying_like(x, *like):
    """``x`` (a pytree) typed as varying over every manual axis that ``x`` or one of ``like``
    varies over: ``lax.pcast(..., to="varying")`` (jax 0.10 to 0.12) of the axes missing from
    each leaf. For the values a program makes afresh (a loop's first carry, a ``lax.cond``
    branch's zeros) that must have the type of what it computes from the local block, inside a
    user's ``shard_map`` that checks replication (``check_vma=True``). Elsewhere nothing is
    typed varying and ``x`` is returned as it is."""
    axes = frozenset().union(*(_varying_axes(leaf) for leaf in jax.tree.leaves(like)))

    def cast(leaf):
        missing = tuple(sorted(axes - _varying_axes(leaf)))
        return lax.pcast(leaf, missing, to="varying") if missing else leaf

    return jax.tree.map(cast, x) if axes else x


def _status(value):
    return _replicated(jnp.asarray(value, jnp.int32).reshape(1))


def _nan_unless(ok, x):
    """``x``, or NaN everywhere when not ``ok``."""
    return jnp.where(ok, x, jnp.full_like(x, jnp.nan))


def _broken(factor):
    """Whether a Cholesky factor failed: JAX fills a failed one with NaN. A diagonal that is
    not finite (NaN input the library did not flag) counts as failed too. (The sum of the
    diagonal, finite exactly when every entry is: they are at most the square roots of ``m``'s
    diagonal, too small to overflow.)"""
    return ~jnp.isfinite(jnp.sum(jnp.diagonal(factor)))


def _cholesky(m):
    """``(L, info)``: the lower Cholesky factor of the Hermitian ``m`` read from its lower
    triangle (all NaN when it fails), and LAPACK's ``info``: 0, or the smallest order ``k``
    whose leading minor is not positive definite.

    JAX gives no ``info``, so a failed factorisation finds ``k`` by bisection over the order:
    the leading minor of order ``k`` is factored as ``m`` with everything outside its ``k x k``
    block replaced by the identity (positive definite exactly when the minor is). A leading
    minor of a positive definite minor is positive definite, so the orders that fail are
    those from ``k`` up. The bisection is a ``lax.while_loop`` (not ``lax.cond``, which
    ``jax.vmap`` turns into running both branches) that runs zero times on success.
    """
    n = m.shape[0]
    factor = lax.linalg.cholesky(m, symmetrize_input=False)
    failed = _broken(factor)
    index = jnp.arange(n, dtype=jnp.int32)
    rows, cols = index[:, None], index[None, :]

    def unresolved(bounds):  # order lo is positive definite (0 trivially), order hi is not
        lo, hi = bounds
        return hi - lo > 1

    def halve(bounds):
        lo, hi = bounds
        mid = (lo + hi) // 2
        # Indices relative to the order: every mask depends on it, so XLA does not hoist one
        # out of the loop (where it would keep it as one more matrix).
        r, c = rows - mid, cols - mid
        outside = ((r == c) & (r >= 0)).astype(m.dtype)  # the identity outside the minor
        minor = jnp.where((r < 0) & (c < 0), m, outside)
        failing = _broken(lax.linalg.cholesky(minor, symmetrize_input=False))
        return jnp.where(failing, lo, mid), jnp.where(failing, mid, hi)

    hi = jnp.where(failed, jnp.int32(n), jnp.int32(0))
    lo = jnp.where(failed, jnp.int32(0), jnp.int32(0))  # typed like hi (varying in shard_map)
    _, info = lax.while_loop(unresolved, halve, (lo, hi))
    return _nan_unless(~failed, factor), info


def _cho_solve(factor, rhs):
    """``(L L^H)^-1 rhs`` for the lower ``L`` (``rhs`` ``[N, k]``)."""
    y = lax.linalg.triangular_solve(factor, rhs, left_side=True, lower=True)
    return lax.linalg.triangular_solve(
        factor, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True
    )


def _inverse(factor):
    """``(L L^H)^-1``, of which the caller reads the lower triangle (jaxmg fills the other
    from it, making the result exactly Hermitian)."""
    n = factor.shape[0]
    return _cho_solve(factor, jnp.eye(n, dtype=factor.dtype))


def potrs(a, b, position, *, moves=None, **_):
    """Cholesky solve: ``(factor, x, status)`` as ``jaxmg_cuda.mg_potrs``."""
    _no_moves(moves)
    factor, info = _cholesky(_matrix(a))
    x = _cho_solve(factor, b.T)
    return factor.T, _replicated(x.T), _status(info)


def potrf(a, position, *, moves=None, **_):
    """The Cholesky factor alone: ``(factor, status)`` as ``jaxmg_cuda.mg_potrf``."""
    _no_moves(moves)
    factor, info = _cholesky(_matrix(a))
    return factor.T, _status(info)


def potri(a, position, *, moves=None, **_):
    """Inverse from the Cholesky factor: ``(inverse, status)`` as ``jaxmg_cuda.mg_potri``."""
    _no_moves(moves)
    factor, info = _cholesky(_matrix(a))
    return _inverse(factor).T, _status(info)


def potrs_factored(factor, b, position, **_):
    """Solve with a factor of :func:`potrf`: ``(x, status)``."""
    x = _cho_solve(_matrix(factor), b.T)
    return _replicated(x.T), _status(0)


def potri_factored(factor, position, *, moves=None, **_):
    """Inverse from a factor of :func:`potrf`: ``(inverse, status)``."""
    _no_moves(moves)
    return _inverse(_matrix(factor)).T, _status(0)


def _syevd(platform: str):
    def syevd(a, position, *, vectors=True, moves=None, **_):
        """Hermitian eigensolver: ``(v, w, status)`` as ``jaxmg_cuda.mg_syevd`` (``v`` is ``a``
        itself, unspecified, without ``vectors``)."""
        _no_moves(moves)
        m = _matrix(a)
        n = m.shape[0]
        if vectors or platform == "gpu":
            v, w = lax.linalg.eigh(m, lower=True, symmetrize_input=False, sort_eigenvalues=True)
        else:
            _, d, e, _ = lax.linalg.tridiagonal(m, lower=True)
            w = jax.scipy.linalg.eigh_tridiagonal(d, e, eigvals_only=True)
            v = None
        ok = jnp.all(jnp.isfinite(w))
        status = _status(jnp.where(ok, 0, n + 1))
        w = _replicated(_nan_unless(ok, w))
        return (_nan_unless(ok, v).T if vectors else a), w, status

    return syevd


def getrf(a, position, *, moves=None, **_):
    """LU with partial pivoting: ``(lu, pivots, status)`` as ``jaxmg_cuda.mg_getrf``."""
    _no_moves(moves)
    lu, pivots, _ = lax.linalg.lu(_matrix(a))
    zero = jnp.diagonal(lu) == 0
    info = jnp.where(jnp.any(zero), jnp.argmax(zero) + 1, 0)
    return _nan_unless(info == 0, lu).T, (pivots + 1).astype(jnp.int32), _status(info)


def getrs(lu, pivots, b, position, *, trans="N", **_):
    """Solve ``op(A) x = b`` with a factor of :func:`getrf`: ``(x, status)``; ``trans`` ``"N"``,
    ``"T"`` or ``"C"``, each as two triangular solves with the factor (as ``jax.scipy.linalg.
    lu_solve`` does)."""
    if trans not in ("N", "T", "C"):
        raise ValueError(f"trans must be 'N', 'T' or 'C', got {trans!r}")
    lu = _matrix(lu)
    n = lu.shape[0]
    # P A = L U with (P A)[i] = A[perm[i]]
    perm = lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, n)
    rhs = b.T
    if trans == "N":  # L U x = P b
        y = lax.linalg.triangular_solve(
            lu, rhs[perm], left_side=True, lower=True, unit_diagonal=True
        )
        x = lax.linalg.triangular_solve(lu, y, left_side=True, lower=False)
    else:  # op(U) op(L) (P x) = b
        conj = trans == "C"
        y = lax.linalg.triangular_solve(
            lu, rhs, left_side=True, lower=False, transpose_a=True, conjugate_a=conj
        )
        y = lax.linalg.triangular_solve(
            lu,
            y,
            left_side=True,
            lower=True,
            unit_diagonal=True,
            transpose_a=True,
            conjugate_a=conj,
        )
        x = jnp.zeros_like(y).at[perm].set(y, unique_indices=True)
    return _replicated(x.T), _status(0)


def _make(platform: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        potrs=potrs,
        potri=potri,
        syevd=_syevd(platform),
        potrf=potrf,
        potrs_factored=potrs_factored,
        potri_factored=potri_factored,
        getrf=getrf,
        getrs=getrs,
    )


_WRAPPERS = {platform: _make(platform) for platform in ("cpu", "gpu")}


class Dense(Engine):
    """Backend ``"jax"`` on a solver axis of one device (chosen there by ``backend=None``); its
    engine of several devices, :mod:`jaxmg.engines.collectives`, hands calls of one to it."""

    name = "jax"
    summary = "JAX's own solvers"
    platforms = None
    whole = True
    # Its status reads A again after a failed factorisation (_cholesky), so XLA would copy A
    # to hand its buffer to the factor: one block more than not donating.
    factors_in_a = False

    def routines(self, platform, caller):
        return _WRAPPERS["cpu" if platform == "cpu" else "gpu"]  # XLA's eigh off CPUs

    def tile(self, T_A, n, ndev, routine, platform, caller, pad):
        return n  # the whole matrix, whatever T_A was asked for

    def participants(self, mesh, axes, platform, caller):
        # One device, which solves alone (each device of the mesh's other axes, in any process,
        # solves its own copy): no rendezvous, so its device and process need not be known.
        return 1, (processes.UNKNOWN_DEVICE,), 0, ()


ENGINE = Dense()
