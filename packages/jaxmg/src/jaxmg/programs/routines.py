"""The ``jax.shard_map`` programs: one jitted program per native routine, on global arrays.

Every public function (:mod:`jaxmg.solvers`) validates its inputs in Python, resolves where
``A`` lives and which engine solves there (:mod:`jaxmg.describe`, :mod:`jaxmg.engines`), and
runs programs of this module, each one ``jax.shard_map`` whose body works on local blocks
(:mod:`jaxmg.programs.local`):

1. relayout the local block to the 1D block-cyclic column layout (:mod:`jaxmg_layout`);
2. hand the native target the local tiles in the form it reads: an ``[L, N]`` row-major array,
   which is the column-major storage of ``N x L`` tiles of a column block;
3. bring the results back to the caller's sharding.

Programs. Each takes the call's :class:`jaxmg.describe.call.Call` first, then the arrays: ``potrs``
(factor and solve in one native call, optionally returning the factor), ``potri``, ``syevd``,
``potrf`` (the Cholesky factor alone), ``potrs_factored``/``potri_factored`` (a solve or the inverse
from that factor), the log-determinant from the factor's diagonal, ``getrf``/``getrs`` (LU with
partial pivoting and its solves). A factor stays where the native call left it: every device keeps
its ``[W, N]`` rows, the column-major storage of its block-cyclic tiles (``W``: the local width,
plus the in-place relayout's room when it ran), as one ``[ndev * W, N]`` array sharded ``P(ax,
None)``. On a process grid ``P(r, c)`` every process keeps its ``[Lc, Lr]`` local array (the
column-major storage of its 2D block-cyclic tiles), the whole sharded ``P(r, c)``. Nothing here is
differentiable by itself: the derivative rules (:mod:`jaxmg.programs.derivatives`) call these
programs.

Sharding forms. For ``A`` sharded by columns, ``P(None, ax)``, the local block is ``A[:, blk]``
and step 2 is a local transpose. For ``A`` sharded by rows, ``P(ax, None)``, the local block
``A[blk, :]`` already *is* that storage, of the column block of ``A^T = conj(A)`` (A is
Hermitian): no transpose, and the solver works on ``conj(A)``. Solutions are conjugated back
(a no-op for real dtypes). For ``A`` sharded over a process grid, ``P(r, c)`` (backend
``"mp"``), step 2 is a local transpose to column-major storage, and step 1 either is left to
the engine (``relayout="native"``: ScaLAPACK's p?gemr2d) or is the 2D relayout in JAX
(:class:`jaxmg.describe.call.GridRoute`).

Failure. A matrix that is not positive definite (potrs, potri), or an eigensolver that fails to
converge (syevd), is not an exception: the status is nonzero and every floating output is NaN.
The status is LAPACK's ``info`` of ``A`` itself on every engine (but LU's on backend ``"jax"``
with the engine's own tile narrower than the layout's: of its order of ``A``'s columns,
docs/sharp-bits.md); where ``A`` holds NaN or Inf it is ``N + 1``, whatever the engine made of
it (:func:`jaxmg.programs.local._finite`: one reduction over each device's block and one
``pmin`` over the solver's axes, in the local bodies and programs here, for every engine).

Engines. The native target of step 2 is one engine's wrapper
(:meth:`jaxmg.engines.base.Engine.routines`): cuSolverMg or its LAPACK twin (``"mg"``), the
distributed engine (``"mp"``), or, on a solver axis of one device, JAX's own dense solvers
behind the same wrappers (``"jax"``, :mod:`jaxmg.engines.dense`; the tile is then the whole
matrix and steps 1 and 3 move nothing). What differs between them is asked of the engine.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jaxmg_layout

from ..describe.call import Call
from .local import (
    _finite,
    _hermitian_from_lower,
    _hermitian_from_triangle,
    _placed,
    _potri_local,
    _potrs_local,
    _relayout,
    _syevd_local,
    _transpose_rows,
    _unless_finite,
)

# --- the static description of one call ------------------------------------------------------


def _rows_spec(call: Call) -> P:
    return call.geometry.factor_spec


def _status(status):
    return status[0]


# --- potrs, potri, syevd: one program each --------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("call", "with_factor"))
def _potrs_program(call: Call, a, b, with_factor=False):
    """``(x, status)``; ``with_factor``: ``(x, factor rows, status)`` (for ``logdet`` and
    ``donate=True``)."""
    geometry = call.geometry
    body = functools.partial(_potrs_local, call, with_factor=with_factor)
    out_specs = (P(), geometry.factor_spec, P()) if with_factor else (P(), P())
    return call.shard_map(body, (geometry.spec, P()), out_specs)(
        _placed(a, geometry.mesh, geometry.spec), _placed(b, geometry.mesh, P())
    )


@functools.partial(jax.jit, static_argnums=0)
def _potri_program(call: Call, a):
    geometry = call.geometry
    inv, status = call.shard_map(
        functools.partial(_potri_local, call), (geometry.spec,), (geometry.spec, P())
    )(_placed(a, geometry.mesh, geometry.spec))
    return (_hermitian_from_lower(inv, geometry) if geometry.form == "grid" else inv), status


@functools.partial(jax.jit, static_argnames=("call", "vectors", "spent"))
def _syevd_program(call: Call, a, vectors, spent=False):
    geometry = call.geometry
    body = functools.partial(_syevd_local, call, vectors=vectors, spent=spent)
    if vectors:
        out_specs = (P(), geometry.spec, P())
    elif spent:  # in the native layout, as a factor
        out_specs = (P(), geometry.factor_spec, P())
    else:
        out_specs = (P(), P())
    return call.shard_map(body, (geometry.spec,), out_specs)(
        _placed(a, geometry.mesh, geometry.spec)
    )


# --- the programs of a factor: Cholesky, its log-determinant, LU ----------------------------------


@functools.partial(jax.jit, static_argnums=0)
def _potrf_program(call: Call, a):
    """``A`` -> ``(factor, status)``: the Cholesky factor rows ``[ndev * W, N]``."""

    def body(a):
        route = call.route()
        finite, position = _finite(call, a)
        f, status = call.native().potrf(
            route.to_native(a), position, moves=route.native_moves, **call.native_kw(route)
        )
        status, f = _unless_finite(call, finite, status, f)
        return f, status

    a = _placed(a, call.geometry.mesh, call.geometry.spec)
    return call.shard_map(body, (call.geometry.spec,), (_rows_spec(call), P()))(a)


@functools.partial(jax.jit, static_argnums=0)
def _cho_solve_program(call: Call, f, b):
    """``x`` (``[N, k]``, replicated) from the factor rows and ``b`` (``[N, k]``)."""

    def body(f, b):
        route = call.route()
        x, _ = call.native().potrs_factored(
            f, call.conj(b.T), call.position(), **call.native_kw(route)
        )
        return call.conj(x.T)

    b = _placed(b, call.geometry.mesh, P())
    return call.shard_map(body, (_rows_spec(call), P()), P())(f, b)


@functools.partial(jax.jit, static_argnums=0)
def _cho_inverse_program(call: Call, f):
    """The full Hermitian ``A^-1`` from the factor rows, sharded (and laid out) like ``A``."""

    def body(f):
        route = call.route()
        moves = None if route.moves is None else (_NO_MOVES, route.moves.from_cyclic)
        inv_rows, _ = call.native().potri_factored(
            f, call.position(), moves=moves, **call.native_kw(route)
        )
        if call.geometry.form == "grid":
            return route.from_native(inv_rows)
        fill = functools.partial(_hermitian_from_triangle, axis_name=call.geometry.axis)
        inv = route.from_native(inv_rows, then=fill)
        return _relayout(inv, call.T_A, call.geometry) if call.cyclic else inv

    inv = call.shard_map(body, (_rows_spec(call),), call.geometry.spec)(f)
    return _hermitian_from_lower(inv, call.geometry) if call.geometry.form == "grid" else inv


_NO_MOVES = np.zeros((0, 4), np.int64)


def _diagonal_local(call: Call, f):
    """This device's entries of the factor's diagonal (``[W]``, zero where padding)."""
    if call.geometry.form == "grid":
        return _grid_diagonal_local(call, f)
    # A factor the engine left in the blocks of A (backend "mp") is laid out in tiles of a block.
    tile = call.n // call.geometry.ndev if call.route().blocks else call.T_A
    plan = jaxmg_layout.CyclicPlan.make(call.n, call.geometry.ndev, tile)
    columns = plan.column_map()  # [ndev, L]: the global column of each local column, -1: pad
    width = f.shape[0]
    table = np.full((call.geometry.ndev, width), -1, np.int64)
    table[:, : columns.shape[1]] = columns
    mine = jnp.asarray(table)[call.position()]
    values = jnp.take_along_axis(f, jnp.maximum(mine, 0)[:, None], axis=1)[:, 0]
    return mine >= 0, values


def _grid_diagonal_local(call: Call, f):
    """:func:`_diagonal_local` on a process grid: ``f`` is this process's ``[Lc, Lr]`` local
    array, diagonal element ``g`` lives on process ``(B % rows, B % cols)`` of block ``B``."""
    plan = jaxmg_layout.BlockCyclic2D.for_blocks(call.n, call.geometry.grid, call.T_A)
    g = np.arange(call.n)
    if call.route().blocks:  # the engine left the factor in the blocks of A
        sr, sc = plan.shard_shape
        i, j, local_row, local_col = g // sr, g // sc, g % sr, g % sc
    else:
        i, j, local_row, local_col = plan.global_to_local(g, g)
    owner = i * plan.cols + j
    count = int(np.bincount(owner, minlength=plan.processes).max())
    rows = np.full((plan.processes, count), -1, np.int64)
    cols = np.zeros((plan.processes, count), np.int64)
    for p in range(plan.processes):
        mine = owner == p
        rows[p, : mine.sum()], cols[p, : mine.sum()] = local_row[mine], local_col[mine]
    r = jnp.asarray(rows)[call.position()]
    c = jnp.asarray(cols)[call.position()]
    return r >= 0, f[c, jnp.maximum(r, 0)]


@functools.partial(jax.jit, static_argnums=0)
def _cho_logdet_program(call: Call, f):
    """``log det A = 2 sum log L_jj`` from the factor rows (real; NaN for a failed factor)."""

    def body(f):
        real, values = _diagonal_local(call, f)
        logs = jnp.where(real, jnp.log(jnp.real(values)), 0)
        return 2 * jax.lax.psum(jnp.sum(logs), call.geometry.axes)

    return call.shard_map(body, (_rows_spec(call),), P())(f)


@functools.partial(jax.jit, static_argnums=0)
def _getrf_program(call: Call, a):
    """``A`` -> ``(lu, pivots, status)``: rows ``[ndev * W, N]``, pivots ``[ndev * W]``; the
    factor of ``A^T`` where :func:`_factors_transpose` says so, else of ``A``."""

    def body(a):
        finite, position = _finite(call, a)
        if call.geometry.form == "rows" and not call.cyclic:
            # A's rows become A^T's, whose storage is A's columns: the factor is of A.
            a = _transpose_rows(a, call.geometry.axis, conjugate=False)
        route = call.route()
        lu, pivots, status = call.native().getrf(
            route.to_native(a), position, moves=route.native_moves, **call.native_kw(route)
        )
        status, lu = _unless_finite(call, finite, status, lu)
        return lu, pivots, status

    spec = call.geometry.spec
    a = _placed(a, call.geometry.mesh, spec)
    pivots = call.geometry.pivots_spec
    return call.shard_map(body, (spec,), (_rows_spec(call), pivots, P()))(a)


def _factors_transpose(call: Call) -> bool:
    """Whether an LU factor of ``A`` sharded by rows is the factor of ``A^T``.

    The local rows of ``A`` are the storage of ``A^T``'s columns, so the engine would factor
    ``A^T``; they are transposed first (one ``all_to_all``), so that the factor, its pivots and
    its status are ``A``'s whatever the sharding, and the usual solve, ``A x = b``, is the
    engine's own (cuSolverMg's ``getrs`` solves only with its factor). A block already in the
    block-cyclic layout (``cyclic_1d``) is factored as it is: ``A^T``.
    """
    return call.geometry.form == "rows" and call.cyclic


def _lu_op(call: Call, trans: str) -> tuple[str, bool]:
    """``op(A) x = b`` as a solve with the factor's own matrix ``S`` (``A``, or ``A^T``): the
    operation on ``S`` (``N``, ``T``, ``C``) and whether to conjugate ``b`` and ``x`` (``A^H =
    conj(S)`` when ``S = A^T``). Without an engine that solves with ``S^T``, ``S^H x = b`` is
    ``S^T conj(x) = conj(b)``, so only ``N`` and ``T`` remain."""
    if _factors_transpose(call):
        op, conjugate = {"N": ("T", False), "T": ("N", False), "C": ("N", True)}[trans]
    else:
        op, conjugate = trans, False
    if op == "C" and _through_transposed_factor(call):
        op, conjugate = "T", not conjugate
    return op, conjugate


def _through_transposed_factor(call: Call) -> bool:
    """Whether solves with ``S^T`` go through :func:`_transposed_lu`: where the engine solves
    only with its factor and builds ``S^T``'s (cuSolverMg's ``getrs``, and its LAPACK twin
    likewise). An engine that does neither (cuSOLVERMp) refuses such solves itself."""
    engine, platform = call.geometry.engine, call.geometry.platform
    return not engine.solves_transposed(platform) and engine.transposes_factor


def _global_of_local(call: Call, local, fill=0):
    """The ``[N]`` vector whose entry ``g`` is ``local[l]`` on the device holding global
    column ``g`` at local column ``l`` (block-cyclic), the same on every device."""
    columns = call.route().plan.column_map()  # [ndev, L]: global column, -1 for padding
    mine = jnp.asarray(columns)[call.position()]
    values = jnp.where(mine >= 0, local[: columns.shape[1]], 0)
    spread = (
        jnp.zeros(call.n, local.dtype)
        .at[jnp.where(mine >= 0, mine, call.n)]
        .add(values, mode="drop")
    )
    return jax.lax.psum(spread, call.geometry.axis) + jnp.asarray(fill, local.dtype)


def _transposed_lu(call: Call, lu, pivots):
    """An LU factor of ``A^T``'s column permutation, made from ``A``'s, for solves with ``A^T``
    by the engine's ``N`` solve (cuSolverMg's ``getrs`` takes no other), inside ``shard_map``.

    From ``A = P L U`` (LAPACK's pivots ``P``, ``L`` unit lower, ``D = diag(U)``):
    ``A^T P = U^T L^T = (U^T D^-1)(D L^T)``, a unit lower times an upper triangular factor with
    no row interchanges. Its storage is ``(LU)^T`` with the part below the diagonal divided by
    the diagonal entry of its column and the part above multiplied by that of its row. One
    ``all_to_all`` brings every device its columns of ``(LU)^T``, which are rows of ``LU``
    spread over all devices (two more blocks of the factor's size, transiently).

    Returns ``(lu_t, pivots_t, perm)``: the factor rows and identity pivots in the layout of
    ``lu`` and ``pivots``, and the permutation with ``x = y[argsort(perm)]`` for the solution
    ``y`` of ``(A^T P) y = b``, i.e. ``x = P y``.
    """
    plan = call.route().plan
    columns = plan.column_map()  # [ndev, L]: the global column of each local column, -1: pad
    ndev, width = columns.shape
    n, tile = call.n, plan.tile
    # To device d: this device's local columns (its rows of lu) at d's global columns.
    chunks = lu[:width][:, np.maximum(columns, 0)]  # [L (mine), ndev (d), L (d's)]
    got = jax.lax.all_to_all(
        jnp.moveaxis(chunks, 1, 0), call.geometry.axis, 0, 0, tiled=True
    )  # [ndev (owner e), L (e's), L (mine)]: got[e, k, l] = LU[g_mine(l), g_e(k)]
    j = np.arange(n)
    owner_slot = ((j // tile) % ndev) * width + (j // tile // ndev) * tile + j % tile
    rows = jnp.moveaxis(got, 2, 0).reshape(width, ndev * width)[:, owner_slot]  # LU[g_mine, :]

    mine = jnp.asarray(columns)[call.position()][:, None]  # [L, 1]
    own = jnp.maximum(mine, 0)
    diagonal = _global_of_local(call, rows[jnp.arange(width), own[:, 0]])
    i = jnp.arange(n)[None, :]
    lu_t = jnp.where(
        i > mine, rows / diagonal[own], jnp.where(i < mine, diagonal[None, :] * rows, rows)
    )
    lu_t = jnp.where(mine >= 0, lu_t, 0)
    lu_t = jnp.pad(lu_t, ((0, lu.shape[0] - width), (0, 0)))
    identity = jnp.pad(
        jnp.where(mine[:, 0] >= 0, mine[:, 0] + 1, 1),
        (0, pivots.shape[0] - width),
        constant_values=1,
    ).astype(pivots.dtype)
    ipiv = _global_of_local(call, pivots)
    perm = jax.lax.linalg.lu_pivots_to_permutation(ipiv - 1, n)
    return lu_t, identity, perm


@functools.partial(jax.jit, static_argnums=(0, 1))
def _lu_solve_program(call: Call, trans: str, lu, pivots, b):
    """``op(A)^-1 b`` (``[N, k]``, replicated) from the factor of :func:`_getrf_program`."""
    op, conjugate = _lu_op(call, trans)
    flip = jnp.conj if conjugate else (lambda v: v)
    through_transpose = op == "T" and _through_transposed_factor(call)

    def body(lu, pivots, b):
        route = call.route()
        if through_transpose:
            lu, pivots, perm = _transposed_lu(call, lu, pivots)
        x, _ = call.native().getrs(
            lu,
            pivots,
            flip(b.T),
            call.position(),
            trans="N" if through_transpose else op,
            **call.native_kw(route),
        )
        x = x.T
        if through_transpose:
            x = jnp.zeros_like(x).at[perm].set(x)
        return flip(x)

    b = _placed(b, call.geometry.mesh, P())
    pivots_spec = call.geometry.pivots_spec
    return call.shard_map(body, (_rows_spec(call), pivots_spec, P()), P())(lu, pivots, b)
