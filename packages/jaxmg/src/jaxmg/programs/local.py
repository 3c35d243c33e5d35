"""The local side of every program: what runs on one device's blocks.

Inside ``jax.shard_map``, on each device's block of ``A`` (the shard_map programs run these, and
so do the functions called inside a user's ``shard_map``, such as ``potrs_no_shardmap``):

- the Hermitian fills and transposes across devices (:func:`_hermitian_from_triangle`,
  :func:`_transpose_rows`; :func:`_hermitian_from_lower`, on a global array, runs its own
  ``shard_map`` on a square grid);
- the local bodies of potrs, potri and syevd (:func:`_potrs_local`, :func:`_potri_local`,
  :func:`_syevd_local`), each taking the call's :class:`jaxmg.describe.call.Call`, whose route
  takes a block to the native target and back;
- the pieces of the derivatives of the functions inside a user's ``shard_map`` (the rules:
  :mod:`jaxmg.programs.derivatives`): products with ``A``'s blocks and their conjugate
  transposes (:func:`_hermitian_matvec`), column blocks of any form (:func:`_columns_of`,
  :func:`_hermitian_part_columns`) and products of column blocks passed around the mesh axis
  (:func:`_ring`, :func:`_ring_into`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

import jaxmg_layout

from ..describe.sharding import _placed
from ..engines.dense import _varying_axes, _varying_like

# --- local (per-device) building blocks, used inside shard_map ------------------------------


def _hermitian_from_lower(x, geometry):
    """The Hermitian matrix whose lower triangle is the global ``x``'s (sharded ``P(r, c)``).

    On a square grid, inside ``shard_map`` (:func:`_hermitian_blocks_from_lower`). On another
    grid the blocks do not pair up across the diagonal, so the upper triangle comes from one
    resharded transpose of the strict lower one.
    """
    rows, cols = geometry.grid
    if rows == cols:
        fill = functools.partial(_hermitian_blocks_from_lower, geometry=geometry)
        spec = geometry.spec
        return jax.shard_map(
            fill, mesh=geometry.mesh, in_specs=spec, out_specs=spec, check_vma=False
        )(x)
    upper = _placed(jnp.conj(jnp.tril(x, -1)).T, geometry.mesh, geometry.spec)
    return jnp.tril(x) + upper


def _hermitian_blocks_from_lower(x, geometry):
    """:func:`_hermitian_from_lower` on the local block ``(i, j)`` of a square grid: a block
    above the diagonal (``i < j``) is the conjugate transpose of block ``(j, i)``, which one
    ``ppermute`` over both grid axes brings; a diagonal block fills itself."""
    rows, cols = geometry.grid
    i = jax.lax.axis_index(geometry.row_axis)
    j = jax.lax.axis_index(geometry.axis)
    pairs = [(a * cols + b, b * cols + a) for a in range(rows) for b in range(cols) if a != b]
    mirrored = jnp.conj(jax.lax.ppermute(x, geometry.axes, pairs)).T if pairs else x
    diagonal = jnp.tril(x) + jnp.conj(jnp.tril(x, -1)).T
    return jnp.where(i > j, x, jnp.where(i < j, mirrored, diagonal))


def _pairings(ndev):
    """Rounds of disjoint device pairs that meet every pair once (a round-robin tournament).

    The circle method: device ``m - 1`` stays put while the others rotate; for an odd count a
    phantom device ``ndev`` gives each round's partner of it a bye.
    """
    m = ndev + ndev % 2
    rounds = []
    for r in range(m - 1):
        pairs = [(r, m - 1)] + [((r + i) % (m - 1), (r - i) % (m - 1)) for i in range(1, m // 2)]
        rounds.append(tuple((min(p), max(p)) for p in pairs if max(p) < ndev))
    return [pairs for pairs in rounds if pairs]


def _mirror_blocks_below(x, axis_name):
    """Fill the blocks left of the diagonal of a row block from the conjugate transpose, in place.

    ``x = Z[blk_j, :]`` (``[s, N]``) on device ``j`` of ``ndev = N / s``; its block ``k`` is
    ``Z[blk_j, blk_k]``. Every block ``k < j`` becomes ``conj(Z[blk_k, blk_j])^T`` (block
    ``(j, k)`` of ``Z^H``). Devices meet in pairs (:func:`_pairings`), one ``ppermute`` of an
    ``s x s`` block per round, from the lower device of each pair to the higher, which
    overwrites the block it got it for. Each round reads what the one before wrote, so the
    updates are in place and one round's blocks are live at a time: no ``[s, N]`` temporary,
    where an ``all_to_all`` needs one (on XLA:CPU three).
    """
    s, n = x.shape
    ndev = n // s
    j = jax.lax.axis_index(axis_name)
    for pairs in _pairings(ndev):
        partner = list(range(ndev))  # a device without a partner this round keeps its own
        for lo, hi in pairs:
            partner[lo], partner[hi] = hi, lo
        k = jnp.asarray(partner, dtype=jnp.int32)[j]
        mine = jax.lax.dynamic_slice_in_dim(x, k * s, s, axis=1)
        received = jax.lax.ppermute(mine, axis_name, list(pairs))  # zeros where none arrives
        new = jnp.where(k < j, jnp.conj(received).T, mine)
        x = jax.lax.dynamic_update_slice_in_dim(x, new, k * s, axis=1)
    return x


def _transpose_rows(z, axis_name, conjugate=True):
    """The row block ``Z^H[blk, :]`` (``Z^T[blk, :]`` without ``conjugate``) from the row block
    ``Z[blk, :]`` (both ``[s, N]``).

    One ``all_to_all`` brings this device ``Z[:, blk]``; its (conjugate) transpose is the
    answer. Not an in-place pairwise swap like :func:`_mirror_blocks_below`: the diagonal block
    would be transposed in place, which XLA:CPU (jax 0.10-0.12) fuses into a loop that
    overwrites elements before their mirror images are read; and the two ``ppermute``s that
    would give it a buffer of its own made programs with several jaxmg calls starve XLA:CPU's
    threads.
    """
    other = jax.lax.all_to_all(z, axis_name, split_axis=1, concat_axis=0, tiled=True)
    return (jnp.conj(other) if conjugate else other).T


def _hermitian_from_triangle(x, axis_name):
    """Fill the triangle the solver left unspecified from the valid one, by Hermitian symmetry.

    ``x`` is the native ``[s, N]`` result, row ``i`` being the solver's column ``j*s + i`` on
    device ``j``; the native potri writes the solver's lower triangle, so ``x[i, r]`` is valid
    for ``r >= j*s + i``. That holds in both forms: read back as columns it is the lower
    triangle of ``inv(A)``, as rows the upper one (the solver saw ``conj(A) = A^T``). Working
    on the native rows leaves a column block's transpose to the caller's last step.
    """
    s = x.shape[0]
    x = _mirror_blocks_below(x, axis_name)
    # The diagonal block is filled in place from itself: safe however XLA fuses it, since each
    # element reads only itself or an element above the diagonal, which keeps its value. A sum
    # of masked terms (each element gets exactly one nonzero term), not one select between the
    # block and its transpose: XLA:CPU's optimising compiler takes seconds to minutes over
    # such a select in real dtypes (23 s for a 512-square float64 block, jax 0.10.2).
    first = jax.lax.axis_index(axis_name) * s
    block = jax.lax.dynamic_slice_in_dim(x, first, s, axis=1)
    rows = jnp.arange(s, dtype=jnp.int32)[:, None]
    cols = jnp.arange(s, dtype=jnp.int32)[None, :]
    upper = jnp.where(cols > rows, block, 0)
    diagonal = jnp.where(cols == rows, jnp.real(block).astype(x.dtype), 0)  # real: Hermitian
    block = upper + diagonal + jnp.conj(upper).T
    return jax.lax.dynamic_update_slice_in_dim(x, block, first, axis=1)


def _relayout(a, T_A, geometry):
    return jaxmg_layout.cyclic_1d_no_shardmap(a, T_A, geometry.axis, axis=geometry.sharded_dim)


# --- the status of a matrix that holds NaN or Inf --------------------------------------------


def _finite(call, a):
    """``(finite, position)``: whether this device's block of ``A`` holds no NaN and no Inf
    (one reduction over the block), and this device's position for the engine's call.

    A native engine's call works in ``a``'s buffer, and XLA, which may order it before the
    reduction, would copy the block for it: there the position is made to depend on the flag
    (``max(position, finite - 1)``, the position itself), so the call comes after the
    reduction (an optimization barrier does not order them: XLA:CPU removes it before it places
    copies). An engine made of JAX operations takes the position as it is: under ``jax.vmap``
    a position that depends on each matrix would turn its ``lax.cond`` on the position into
    both branches on every device."""
    # One reduction that reads the block and writes nothing of its size: 0 where every element
    # is finite, NaN where one is not (0 * NaN and 0 * Inf are NaN, and NaN stays).
    zero = jnp.zeros((), a.dtype)
    finite = jnp.isfinite(jax.lax.reduce(a, zero, lambda u, v: u * 0 + v * 0, range(a.ndim)))
    position = call.position()
    if not call.geometry.engine.native:
        return finite, position
    return finite, jnp.maximum(position, finite.astype(position.dtype) - 1)


def _finite_everywhere(call, finite, status):
    """Whether every device's block of ``A`` is finite (:func:`_finite`'s flags, one ``pmin``
    over the solver's axes), after the engine's call: the ``pmin`` reads ``status``, so XLA
    cannot run it first. Else, across processes, a process that died before the call would
    be met in this collective, which cannot name it, instead of in the engine's own
    rendezvous, which does (tests/multiprocess)."""
    after = jnp.any(status == jnp.iinfo(status.dtype).min)  # never true: it orders the pmin
    local = jnp.where(after, 0, finite.astype(jnp.int32))
    return jax.lax.pmin(local, call.geometry.axes) > 0


def _unless_finite(call, finite, status, *outputs):
    """``(status, *outputs)`` of a solver, given :func:`_finite`'s flag of each device's
    block: where any device's block of ``A`` holds NaN or Inf (:func:`_finite_everywhere`),
    status ``N + 1`` and every output NaN, whatever the engine made of it."""
    finite = _finite_everywhere(call, finite, status)
    status = jnp.where(finite, status, jnp.asarray(call.n + 1, status.dtype))
    # Times 1 or NaN: XLA writes the product in the output's own buffer, where a select held
    # one more block of it (the factor with A donated, 2048 on 4 CPU devices)
    scale = jnp.where(finite, 1.0, jnp.nan)
    return (status, *(x * scale.astype(x.dtype) for x in outputs))


def _potrs_local(call, a, b, with_factor=False):
    """Solve on local blocks. ``a``: local block of A; ``b``: replicated ``[N, nrhs]``.
    Returns ``(x, status)``, or ``(x, factor rows, status)`` ``with_factor``."""
    route = call.route()
    finite, position = _finite(call, a)
    factor, x_rows, status = call.native().potrs(
        route.to_native(a),
        call.conj(b.T),
        position,
        moves=route.native_moves,
        **call.native_kw(route),
        **({"factor": with_factor} if route.blocks else {}),
    )
    status, x_rows, first = _unless_finite(call, finite, status, x_rows, factor[:1])
    if with_factor:
        # No output of the caller's: its first row NaN (in place) is enough for what is made
        # of it (the log-determinant, the derivatives' solves) to be NaN.
        factor = factor.at[:1].set(first)
    if with_factor:
        return call.conj(x_rows.T), factor, status
    return call.conj(x_rows.T), status


def _potri_local(call, a):
    route = call.route()
    geometry = call.geometry
    finite, position = _finite(call, a)
    inv_rows, status = call.native().potri(
        route.to_native(a), position, moves=route.native_moves, **call.native_kw(route)
    )
    if geometry.form == "grid":  # the lower triangle: the caller fills the upper one
        inv = route.from_native(inv_rows)
    else:
        fill = functools.partial(_hermitian_from_triangle, axis_name=geometry.axis)
        inv = route.from_native(inv_rows, then=fill)
        inv = _relayout(inv, call.T_A, geometry) if call.cyclic else inv
    # NaN on the filled block, through a conditional: it passes through in its own buffer
    finite = _finite_everywhere(call, finite, status)
    status = jnp.where(finite, status, jnp.asarray(call.n + 1, status.dtype))
    return jax.lax.cond(finite, lambda x: x, lambda x: x * jnp.nan, inv), status


def _syevd_local(call, a, vectors, v_columns=False, spent=False):
    """``v_columns``: return this device's column block ``V[:, blk]`` whatever the form of ``a``
    (jaxmg 0.0.x's ``syevd_shardmap_ctx``); else ``V``'s block in the form of ``a``. ``spent``
    (values only): also return the buffer the solver overwrote, in its native layout, so that
    a program with ``A`` donated has an output to give ``A``'s buffer to."""
    route = call.route()
    geometry = call.geometry
    finite, position = _finite(call, a)
    v_rows, w, status = call.native().syevd(
        route.to_native(a),
        position,
        vectors=vectors,
        moves=route.native_moves,
        **call.native_kw(route),
    )
    # NaN where A held NaN or Inf: on V as returned, where XLA writes it in place (on the
    # solver's own buffer it held one more block with A donated and A by columns)
    status, w = _unless_finite(call, finite, status, w)
    if not vectors:  # v_rows is then the buffer the solver overwrote
        return (w, v_rows, status) if spent else (w, status)
    if geometry.form == "grid":
        v = route.from_native(v_rows)
    elif geometry.form == "cols":
        v = v_rows.T if call.cyclic else route.from_native(v_rows)
    elif v_columns:
        # The solver saw conj(A): its eigenvector columns are conj(V), which read back by rows
        # is V^H, whose local conjugate transpose is the column block of V.
        v = jnp.conj(route.from_native(v_rows)).T
    else:  # the rows of V take one conjugate transpose across devices
        v = _transpose_rows(route.from_native(v_rows), geometry.axis)
        v = _relayout(v, call.T_A, geometry) if call.cyclic else v
    # NaN on V as returned, through a conditional: V passes through it in its own buffer,
    # where a product or a select held one more block (A donated by columns)
    finite = _finite_everywhere(call, finite, status)
    v = jax.lax.cond(finite, lambda v: v, lambda v: v * jnp.nan, v)
    return w, v, status


# --- the pieces of the derivatives on local blocks (inside a user's shard_map) -------------------


def _local_indices(call):
    """``[W]``: the global row (``sharded_by="rows"``) or column (``"cols"``) of each of this
    device's ``W`` along the sharded dimension, ``-1`` for padding (block-cyclic layouts)."""
    ndev = call.geometry.ndev
    if call.cyclic:
        table = jaxmg_layout.CyclicPlan.make(call.n, ndev, call.T_A).column_map()
    else:
        table = np.arange(call.n).reshape(ndev, call.n // ndev)
    return jnp.asarray(table, jnp.int32)[call.position()]


def _gather_local(v, index):
    """The entries (rows) of the ``[N, k]`` ``v`` at ``index`` (zero where ``-1``)."""
    return jnp.where((index >= 0)[:, None], v[jnp.maximum(index, 0)], 0)


def _scatter_local(y, index, call):
    """``[N, k]``, the same on every device: each device's rows ``y`` put at their ``index``."""
    spread = jnp.zeros((call.n, y.shape[1]), y.dtype)
    spread = spread.at[jnp.where(index >= 0, index, call.n)].add(y, mode="drop")
    return jax.lax.psum(spread, call.geometry.axis)


def _hermitian_matvec(call, a, v):
    """``(A + A^H) v / 2`` for the matrix whose local block (in the call's form and layout) is
    ``a``, ``v`` ``[N, k]`` the same on every device; the result too. No transpose of ``A``: each
    device multiplies its block and its conjugate transpose, one ``psum`` each."""
    index = _local_indices(call)
    mine = _gather_local(v, index)  # v at this device's rows or columns
    if call.geometry.form == "cols":  # a = A[:, mine]
        times = jax.lax.psum(_mm(a, mine), call.geometry.axis)
        adjoint = _scatter_local(_mm(jnp.conj(a).T, v), index, call)
    else:  # a = A[mine, :]
        times = _scatter_local(_mm(a, v), index, call)
        adjoint = jax.lax.psum(_mm(jnp.conj(a).T, mine), call.geometry.axis)
    return 0.5 * (times + adjoint)


def _mm(x, y):
    return jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST)


def _same_everywhere(x, like):
    """``x``, whose value is the same on every device, typed as varying over no more manual axes
    than ``like``: the mean of the devices' copies (``lax.custom_linear_solve`` types its
    solution as varying over every axis its matrix varies over, jax 0.10 to 0.12). The mean, not
    one device's copy: its transpose hands every device the same cotangent, as the solvers'
    collectives need."""
    extra = tuple(sorted(_varying_axes(x) - _varying_axes(like)))
    if not extra:
        return x
    count = functools.reduce(lambda n, name: n * jax.lax.axis_size(name), extra, 1)
    return jax.lax.psum(x, extra) / count


def _blocks(x, call):
    """The local block ``x`` in JAX's blocks (out of the block-cyclic layout)."""
    if not call.cyclic:
        return x
    g = call.geometry
    return jaxmg_layout.undo_cyclic_1d_no_shardmap(x, call.T_A, call.n, g.axis, axis=g.sharded_dim)


def _columns_of(x, call, hermitian=False):
    """``X[:, blk]`` (``[N, N / p]``) of the matrix ``X`` whose local block in the call's form
    and layout is ``x``: local where ``X`` is ``hermitian`` or sharded by columns, else one
    ``all_to_all``."""
    x = _blocks(x, call)
    if call.geometry.form == "cols":
        return x
    if hermitian:  # X[:, blk] = X[blk, :]^H
        return jnp.conj(x).T
    return _transpose_rows(x, call.geometry.axis, conjugate=False).T


def _from_columns(xc, call, hermitian=False):
    """The inverse of :func:`_columns_of`: ``X``'s local block in the call's form and layout."""
    g = call.geometry
    if g.form == "cols":
        x = xc
    elif hermitian:
        x = jnp.conj(xc).T
    else:  # X[blk, :] = ((X^T)[:, blk])^T, and xc^T = (X^T)[blk, :]
        x = _transpose_rows(xc.T, g.axis, conjugate=False)
    return _relayout(x, call.T_A, g) if call.cyclic else x


def _hermitian_part_columns(d, call):
    """``(D + D^H)[:, blk] / 2`` from ``D``'s local block ``d`` in the call's form and layout:
    one ``all_to_all``."""
    d = _blocks(d, call)
    axis = call.geometry.axis
    if call.geometry.form == "cols":  # (D^H)[:, blk] = (conj(D)[blk, :])^T
        return 0.5 * (d + _transpose_rows(d.T, axis).T)
    return 0.5 * (_transpose_rows(d, axis, conjugate=False).T + jnp.conj(d).T)


def _ring(x, b, axis, adjoint=False):
    """``(X B)[:, blk]``, or ``(X^H B)[:, blk]`` with ``adjoint``, from the column blocks
    ``x = X[:, blk]`` and ``b = B[:, blk]`` (``[N, s]`` on each of ``p`` devices): ``X``'s blocks
    passed once around the ring (``p - 1`` ``ppermute``s of a block), so that no device holds
    more than two blocks of ``X`` and ``B``."""
    ndev = jax.lax.axis_size(axis)
    position = jax.lax.axis_index(axis)
    s = x.shape[1]
    shift = [(i, (i + 1) % ndev) for i in range(ndev)]

    def step(k, carry):
        out, block = carry  # block: X[:, blk_e] of device e
        e = (position - k) % ndev
        if adjoint:  # rows blk_e of X^H B[:, blk]
            out = jax.lax.dynamic_update_slice_in_dim(out, _mm(jnp.conj(block).T, b), e * s, 0)
        else:  # X[:, blk_e] B[blk_e, blk]
            out = out + _mm(block, jax.lax.dynamic_slice_in_dim(b, e * s, s, 0))
        if ndev > 1:
            block = jax.lax.ppermute(block, axis, shift)
        return out, block

    out = _varying_like(jnp.zeros((x.shape[0], s), jnp.result_type(x, b)), x, b)
    return jax.lax.fori_loop(0, ndev, step, (out, x))[0]


def _ring_into(x, rows, axis):
    """``(X B)[:, blk]`` from ``x = X[:, blk]`` and this device's row block ``rows = B[blk, :]``
    (``[s, N]``): the partial sums travel the ring, each device adding its
    ``X[:, blk] B[blk, blk_t]`` to the one bound for device ``t``; ``X`` stays where it is
    (for an ``X`` that derivatives take as a constant, and a ``B`` that they transpose)."""
    ndev = jax.lax.axis_size(axis)
    position = jax.lax.axis_index(axis)
    s = x.shape[1]
    shift = [(i, (i + 1) % ndev) for i in range(ndev)]

    def step(k, out):  # out: the partial sum bound for device t, which it reaches last
        t = (position - 1 - k) % ndev
        out = out + _mm(x, jax.lax.dynamic_slice_in_dim(rows, t * s, s, 1))
        return jax.lax.ppermute(out, axis, shift) if ndev > 1 else out

    out = _varying_like(jnp.zeros((x.shape[0], s), jnp.result_type(x, rows)), x, rows)
    out = jax.lax.fori_loop(0, ndev - 1, step, out)
    t = (position - ndev) % ndev  # this device: the last addition, no move
    return out + _mm(x, jax.lax.dynamic_slice_in_dim(rows, t * s, s, 1))
