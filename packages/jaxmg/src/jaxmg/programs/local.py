"""The local side of every program: what runs on one device's blocks.

Inside ``jax.shard_map``, on each device's block of ``A`` (the shard_map programs run these, and
so do the functions called inside a user's ``shard_map``, such as ``potrs_no_shardmap``):

- the Hermitian fills and transposes across devices (:func:`_hermitian_from_triangle`,
  :func:`_transpose_rows`; :func:`_hermitian_from_lower`, on a global array, runs its own
  ``shard_map`` on a square grid);
- the local bodies of potrs, potri and syevd (:func:`_potrs_local`, :func:`_potri_local`,
  :func:`_syevd_local`), each taking the call's :class:`jaxmg.describe.call.Call`, whose route
  takes a block to the native target and back.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

import jaxmg_layout

from ..describe.sharding import _placed

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


def _potrs_local(call, a, b, with_factor=False):
    """Solve on local blocks. ``a``: local block of A; ``b``: replicated ``[N, nrhs]``.
    Returns ``(x, status)``, or ``(x, factor rows, status)`` ``with_factor``."""
    route = call.route()
    factor, x_rows, status = call.native().potrs(
        route.to_native(a),
        call.conj(b.T),
        call.position(),
        moves=route.native_moves,
        **call.native_kw(route),
        **({"factor": with_factor} if route.blocks else {}),
    )
    if with_factor:
        return call.conj(x_rows.T), factor, status
    return call.conj(x_rows.T), status


def _potri_local(call, a):
    route = call.route()
    geometry = call.geometry
    inv_rows, status = call.native().potri(
        route.to_native(a), call.position(), moves=route.native_moves, **call.native_kw(route)
    )
    if geometry.form == "grid":  # the lower triangle: the caller fills the upper one
        return route.from_native(inv_rows), status
    fill = functools.partial(_hermitian_from_triangle, axis_name=geometry.axis)
    inv = route.from_native(inv_rows, then=fill)
    return (_relayout(inv, call.T_A, geometry) if call.cyclic else inv), status


def _syevd_local(call, a, vectors, v_columns=False, spent=False):
    """``v_columns``: return this device's column block ``V[:, blk]`` whatever the form of ``a``
    (jaxmg 0.0.x's ``syevd_shardmap_ctx``); else ``V``'s block in the form of ``a``. ``spent``
    (values only): also return the buffer the solver overwrote, in its native layout, so that
    a program with ``A`` donated has an output to give ``A``'s buffer to."""
    route = call.route()
    geometry = call.geometry
    v_rows, w, status = call.native().syevd(
        route.to_native(a),
        call.position(),
        vectors=vectors,
        moves=route.native_moves,
        **call.native_kw(route),
    )
    if not vectors:
        return (w, v_rows, status) if spent else (w, status)
    if geometry.form == "grid":
        return w, route.from_native(v_rows), status
    if geometry.form == "cols":
        return w, (v_rows.T if call.cyclic else route.from_native(v_rows)), status
    # The solver saw conj(A): its eigenvector columns are conj(V), which read back by rows is
    # V^H, whose local conjugate transpose is the column block of V. The rows of V take one
    # conjugate transpose across devices.
    if v_columns:
        return w, jnp.conj(route.from_native(v_rows)).T, status
    v = _transpose_rows(route.from_native(v_rows), geometry.axis)
    return w, (_relayout(v, call.T_A, geometry) if call.cyclic else v), status
