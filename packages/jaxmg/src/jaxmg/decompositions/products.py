"""Products of sharded matrices, and triangular solves with them, that never hold a whole
``K x K`` matrix on one device.

XLA's partitioner computes a Gram matrix ``X^H X`` of a row-sharded ``X`` as a full ``K x K``
partial sum on every device followed by an all-reduce, and ``X G`` by gathering ``G``: for a
square ``X`` that is a whole matrix per device. The products here send one block at a time
instead, straight to the device that needs it (``ppermute``) in :data:`PIECES` pieces of its
columns (the Gram matrix by rows: a ring reduce-scatter of partial sums), so each device holds
its own blocks and one piece in flight. They run inside ``jax.shard_map`` on the local blocks
of ``X`` sharded by rows ``P(axis, None)`` (``x``: ``[M/p, K]``) or by columns ``P(None,
axis)`` (``x``: ``[M, K/p]``), ``K`` divisible by the ``p`` devices of ``axis``.

Used by the Newton-Schulz polish of the singular vectors (:mod:`jaxmg.decompositions.svd`), by
CholeskyQR (:mod:`jaxmg.decompositions.qr`: its Gram matrices and its ``X R^{-1}``,
:func:`right_triangular_solve`, a blocked triangular solve that sends one piece of ``R`` or of the
solution at a time) and by QDWH (:mod:`jaxmg.decompositions.qdwh`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

_HIGHEST = lax.Precision.HIGHEST


def _mm(a, b):
    return jnp.matmul(a, b, precision=_HIGHEST)


def _h(a):
    return jnp.conj(a).T


def _shift(p, by):
    """``ppermute`` pairs: device ``j`` sends to ``j + by`` (mod ``p``)."""
    return [(j, (j + by) % p) for j in range(p)]


def _after(value, earlier):
    """``value``, computed only once ``earlier`` is: ``0 * earlier[0, 0]`` is added (nothing
    changes unless ``earlier`` is NaN already). Without it XLA may run every step's
    communication and product at once, holding a block per step instead of one in flight (it
    combines independent all-reduces, and moves independent work ahead)."""
    return value + 0 * earlier[:1, :1].astype(value.dtype)


def _received(piece, step, axis, p, earlier, prepare=None):
    """Device ``me + step``'s ``piece`` (``prepare``d) on device ``me``: every device sends its
    own straight to device ``me - step`` (nothing moves at step 0), made once ``earlier`` is
    computed (:func:`_after`; else XLA makes the piece once for every step, and keeps it)."""
    piece = _after(piece, earlier)
    if prepare is not None:
        piece = prepare(piece)
    return lax.ppermute(piece, axis, _shift(p, -step)) if step else piece


def _columns(x, block, width):
    return lax.dynamic_slice_in_dim(x, block * width, width, axis=1)


def _rows(x, block, width):
    return lax.dynamic_slice_in_dim(x, block * width, width, axis=0)


#: How many pieces of its columns a block is sent in (where they divide its width): two halve
#: the block in flight (QDWH's stacked ``[2N, N/p]`` blocks by columns are two blocks of ``A``)
#: for twice the collectives, and a program that takes 10-25% longer to compile; four saved
#: one more block of ``A`` but took 40-60% longer to compile (svd, qr, polar, 4 and 8 devices).
PIECES = 2

#: Blocks smaller than this many bytes go whole: there the memory a piece saves is nothing, and
#: the compile time the pieces cost is most of a call's (128 KiB: the smallest pieces of an N =
#: 1024 float64 matrix on 8 devices still split).
SPLIT_BYTES = 1 << 17


def _pieces(rows, width, dtype):
    """How many pieces of its columns a ``[rows, width]`` block of ``dtype`` is sent in (the
    solve by columns cuts its rows by the same rule, ``_pieces(width, rows, dtype)``)."""
    big = rows * width * jnp.dtype(dtype).itemsize >= SPLIT_BYTES
    return PIECES if big and width % PIECES == 0 else 1


# --- X sharded by rows: local x [M/p, K]; the K x K matrices by rows, local [K/p, K]


def gram_by_rows(x, y, axis, p):
    """Row block ``me`` of ``X^H Y``: a ring reduce-scatter of the devices' contributions
    (at step ``s`` device ``d`` adds its part of block ``d - s - 1`` and passes it on, so that
    the last step leaves block ``d`` on device ``d``)."""
    me = lax.axis_index(axis)
    width = x.shape[1] // p
    # X^H once, its row blocks contiguous: XLA:CPU's dot of a transposed column slice is slower
    xh = _h(x).reshape(p, width, x.shape[0])
    acc = _mm(xh[(me - 1) % p], y)
    for step in range(1, p):
        acc = lax.ppermute(acc, axis, _shift(p, 1))
        acc = acc + _mm(_after(xh[(me - step - 1) % p], acc), y)
    return acc


def times_by_rows(x, g, axis, p):
    """Local rows of ``X G`` from ``G``'s row block ``me``: ``x_{me, j} g_j`` for every ``j``.
    At step ``s`` every device sends its row block of ``G`` to device ``me - s`` directly, in
    pieces of its columns (:func:`_pieces`), each piece giving columns of the product."""
    me = lax.axis_index(axis)
    width = x.shape[1] // p
    n2 = g.shape[1]
    cols = n2 // _pieces(g.shape[0], n2, g.dtype)
    out = jnp.zeros((x.shape[0], n2), jnp.result_type(x, g))
    for step in range(p):
        xs = _columns(x, (me + step) % p, width)
        for c in range(0, n2, cols):
            piece = _received(g[:, c : c + cols], step, axis, p, out)
            done = lax.dynamic_slice_in_dim(out, c, cols, axis=1)
            out = lax.dynamic_update_slice_in_dim(out, done + _mm(xs, piece), c, axis=1)
    return out


# --- X sharded by columns: local x [M, K/p]; the K x K matrices by columns, local [K, K/p]


def gram_by_columns(x, y, axis, p):
    """Column block ``me`` of ``X^H Y``: ``x_j^H y_me`` for every ``j``. At step ``s`` every
    device sends its block of ``X`` to device ``me - s`` directly, in pieces of its columns
    (:func:`_pieces`: one piece in flight, not a whole ``[M, K/p]`` block), each piece giving
    rows of ``x_j^H y_me``."""
    me = lax.axis_index(axis)
    width = x.shape[1]
    cols = width // _pieces(x.shape[0], width, x.dtype)
    out = jnp.zeros((p * width, y.shape[1]), jnp.result_type(x, y))
    for step in range(p):
        for c in range(0, width, cols):
            # sent as X^H (XLA:CPU's dot of a transposed operand is slower)
            xh = _received(x[:, c : c + cols], step, axis, p, out, prepare=_h)
            row = ((me + step) % p) * width + c
            out = lax.dynamic_update_slice_in_dim(out, _mm(xh, y), row, axis=0)
    return out


def times_by_columns(x, g, axis, p):
    """Local columns of ``X G`` from ``G``'s column block ``me`` (``[K, N2/p]``): ``x_j
    g_{j, me}`` for every ``j``. At step ``s`` every device sends its block of ``X`` to device
    ``me - s`` directly, in pieces of its columns (:func:`_pieces`)."""
    me = lax.axis_index(axis)
    width = x.shape[1]
    cols = width // _pieces(x.shape[0], width, x.dtype)
    out = jnp.zeros((x.shape[0], g.shape[1]), jnp.result_type(x, g))
    for step in range(p):
        g_j = _rows(g, (me + step) % p, width)
        for c in range(0, width, cols):
            out = out + _mm(_received(x[:, c : c + cols], step, axis, p, out), g_j[c : c + cols])
    return out


# --- the Newton-Schulz polish


def _axis(spec):
    return (spec[0], True) if spec[0] is not None else (spec[1], False)


def newton_schulz(x, keep, mesh, spec, steps=2):
    """``steps`` Newton-Schulz steps ``X <- X + X (I - X^H X) / 2`` on the columns ``keep``
    (a boolean ``[K]``, replicated) of ``x`` sharded as ``spec`` (``P(axis, None)`` or
    ``P(None, axis)``), the other columns left as they are. Each step squares ``X``'s distance
    from orthonormal columns."""
    axis, by_rows = _axis(spec)
    p = mesh.shape[axis]

    def body(x, keep):
        me = lax.axis_index(axis)
        k = x.shape[1] * (1 if by_rows else p)
        width = k // p
        if not by_rows:
            keep = lax.dynamic_slice_in_dim(keep, me * width, width)
        kept = jnp.where(keep[None, :], x, 0)
        # The local block of the identity: rows me of I (by rows) or its columns me.
        ids = jnp.arange(k, dtype=me.dtype)
        local = me * width + jnp.arange(width, dtype=me.dtype)
        eye = (local[:, None] == ids[None, :]) if by_rows else (ids[:, None] == local[None, :])
        for _ in range(steps):
            if by_rows:
                gram = gram_by_rows(kept, kept, axis, p)
                kept = kept + times_by_rows(kept, eye.astype(x.dtype) - gram, axis, p) / 2
            else:
                gram = gram_by_columns(kept, kept, axis, p)
                kept = kept + times_by_columns(kept, eye.astype(x.dtype) - gram, axis, p) / 2
        return jnp.where(keep[None, :], kept, x)

    return jax.shard_map(
        body, mesh=mesh, in_specs=(spec, P(None)), out_specs=spec, check_vma=False
    )(x, keep)


def _on_blocks(by_rows, by_columns, mesh, spec, *arrays, **options):
    """``by_rows`` (or ``by_columns``, as ``spec`` shards) on each device's blocks of
    ``arrays``, all sharded as ``spec``, and so is the result: ``body(*blocks, axis, p,
    **options)`` inside ``jax.shard_map``."""
    axis, rows = _axis(spec)
    body = by_rows if rows else by_columns
    return jax.shard_map(
        lambda *blocks: body(*blocks, axis, mesh.shape[axis], **options),
        mesh=mesh,
        in_specs=(spec,) * len(arrays),
        out_specs=spec,
        check_vma=False,
    )(*arrays)


def times(x, g, mesh, spec):
    """``X G`` for ``X`` ``[M, K]`` and ``G`` ``[K, N2]`` both sharded as ``spec`` (by rows or
    by columns, ``K`` and the sharded dimensions divisible by the devices); the result sharded
    the same way."""
    return _on_blocks(times_by_rows, times_by_columns, mesh, spec, x, g)


def distance_from_orthonormal(x, mesh, spec):
    """``max |X^H X - I|`` (replicated) for ``X`` ``[M, K]`` sharded as ``spec``, from the
    Gram matrix's blocks: no ``K x K`` matrix whole on a device."""
    axis, by_rows = _axis(spec)
    p = mesh.shape[axis]

    def body(x):
        me = lax.axis_index(axis)
        k = x.shape[1] * (1 if by_rows else p)
        width = k // p
        ids = jnp.arange(k, dtype=me.dtype)
        local = me * width + jnp.arange(width, dtype=me.dtype)
        if by_rows:
            gram, eye = gram_by_rows(x, x, axis, p), local[:, None] == ids[None, :]
        else:
            gram, eye = gram_by_columns(x, x, axis, p), ids[:, None] == local[None, :]
        return lax.pmax(jnp.max(jnp.abs(gram - eye.astype(x.dtype))), axis)

    return jax.shard_map(body, mesh=mesh, in_specs=(spec,), out_specs=P(), check_vma=False)(x)


def gram(x, y, mesh, spec):
    """``X^H Y`` for ``X``, ``Y`` sharded as ``spec`` (by rows or by columns); the result
    ``[K, K2]`` sharded the same way (by rows: its rows; by columns: its columns)."""
    return _on_blocks(gram_by_rows, gram_by_columns, mesh, spec, x, y)


# --- X T^{-1} for a triangular T sharded like X


def _from(block, me, j, axis, earlier):
    """Device ``j``'s ``block`` on every device of ``axis`` (an all-reduce of one block), sent
    once ``earlier`` is computed (:func:`_after`)."""
    return lax.psum(_after(jnp.where(me == j, block, jnp.zeros_like(block)), earlier), axis)


def _solve_right(t, b, lower):
    """``Y`` with ``Y T = B`` for a triangular ``T`` (LAPACK's trsm, right side)."""
    return lax.linalg.triangular_solve(t, b, left_side=False, lower=lower)


def _solve_by_rows(x, t, axis, p, lower):
    """``X T^{-1}``, local rows of ``X`` ``[M/p, K]`` and row block ``me`` of ``T``
    ``[K/p, K]``. Block column ``j`` of the solution, ``Y_j = (X_j - sum_i Y_i T_ij) T_jj^{-1}``
    (``i < j`` for an upper ``T``, ``i > j`` for a lower one), needs row block ``j`` of ``T``:
    it goes to every device in turn, its diagonal block ``T_jj`` first, then the part that
    the later blocks need in pieces of its columns (:func:`_pieces`), and each device solves
    its own rows."""
    me = lax.axis_index(axis)
    k = x.shape[1]
    w = k // p
    for j in reversed(range(p)) if lower else range(p):
        diagonal = slice(j * w, (j + 1) * w)
        t_jj = _from(t[:, diagonal], me, j, axis, x)
        x = x.at[:, diagonal].set(_solve_right(t_jj, x[:, diagonal], lower))
        start, stop = (0, j * w) if lower else ((j + 1) * w, k)
        if stop > start:
            cols = (stop - start) // _pieces(w, stop - start, t.dtype)
            for c in range(start, stop, cols):
                t_jc = _from(t[:, c : c + cols], me, j, axis, x)
                x = x.at[:, c : c + cols].add(-_mm(x[:, diagonal], t_jc))
    return x


def _solve_by_columns(x, t, axis, p, lower):
    """``X T^{-1}``, local columns of ``X`` ``[M, K/p]`` and column block ``me`` of ``T``
    ``[K, K/p]``: device ``j`` solves ``Y_j`` once every ``Y_i`` it depends on has been
    subtracted (the other devices solve with the identity, which leaves their blocks as they
    are), then sends it in pieces of its columns (:func:`_pieces`) to every device, and the
    devices whose blocks depend on it subtract its part. The solves and the updates go in
    pieces of the rows, in place: a whole ``[M, K/p]`` product beside the block, or a ``where``
    between two copies of it, would hold one block more. ``T``'s parts are cut once they are
    needed (:func:`_after`; XLA would cut them all at the start and keep them)."""
    me = lax.axis_index(axis)
    m, w = x.shape
    cols = w // _pieces(m, w, x.dtype)
    rows = m // _pieces(w, m, x.dtype)
    identity = jnp.eye(w, dtype=t.dtype)
    for j in reversed(range(p)) if lower else range(p):
        t_jj = jnp.where(me == j, _after(t[j * w : (j + 1) * w], x), identity)
        for r in range(0, m, rows):
            x = x.at[r : r + rows].set(_solve_right(t_jj, x[r : r + rows], lower))
        depends = (me < j) if lower else (me > j)
        for c in range(0, w, cols):  # device j's x is Y_j throughout
            y_jc = _from(x[:, c : c + cols], me, j, axis, x)
            t_jc = _after(t[j * w + c : j * w + c + cols], y_jc)
            for r in range(0, m, rows):
                update = jnp.where(depends, _mm(y_jc[r : r + rows], t_jc), 0)
                x = x.at[r : r + rows].add(-update)
    return x


def right_triangular_solve(x, t, mesh, spec, lower=False):
    """``X T^{-1}`` for ``X`` ``[M, K]`` and a triangular ``T`` ``[K, K]`` (upper, or
    ``lower``), both sharded as ``spec`` (by rows or by columns, ``K`` divisible by the
    devices); the result sharded as ``X``. Each device holds its blocks and one block in
    flight; the work is LAPACK's trsm's, shared by the devices."""
    return _on_blocks(_solve_by_rows, _solve_by_columns, mesh, spec, x, t, lower=lower)
