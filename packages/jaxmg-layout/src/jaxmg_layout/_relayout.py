"""Block sharding <-> 1D block-cyclic layout.

The shift route (one ``ppermute``, one ``all_to_all``), forward (see :mod:`jaxmg_layout._plan`
for the names), on device ``d`` of ``ndev``:

1. *shift*: device ``d`` must end up holding columns ``[d*s', (d+1)*s')`` of A right-padded
   with zeros, ``s' = s + p``. It drops its first ``d*p`` columns and appends the first
   ``(d+1)*p`` columns of device ``d+1`` (zeros on the last device). One ``ppermute`` sends
   every device's first ``(ndev-1)*p`` columns to its left neighbour.
2. *exchange*: view the ``s'`` columns as ``(blocks, ndev, tile)``. Column group ``j`` holds
   global tiles ``k`` with ``k % ndev == j``, so it belongs to device ``j``; one
   ``all_to_all`` over that axis delivers it there, where the tile lands in local slot
   ``d * blocks + b == k // ndev``.
3. keep the first ``L = ceil(s/tile)*tile`` columns: every later slot is pure padding.

The undo runs the same steps backwards. Tile sizes the shift cannot produce take the gather
route (:func:`_gather_exchange`). The sharded axis may be any axis of the local block
(``axis=1``: columns, the original form; ``axis=0``: rows).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from ._plan import CyclicPlan

__all__ = [
    "cyclic_1d_layout",
    "cyclic_1d_no_shardmap",
    "undo_cyclic_1d_layout",
    "undo_cyclic_1d_no_shardmap",
]


def _axis(x, axis: int) -> int:
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis={axis} is out of range for an array of rank {x.ndim}.")
    return axis % x.ndim


def _zeros_like_along(x, axis: int, size: int):
    shape = list(x.shape)
    shape[axis] = size
    return jnp.zeros(shape, x.dtype)


def _split_axis(x, axis: int, sizes: tuple[int, ...]):
    return x.reshape(x.shape[:axis] + sizes + x.shape[axis + 1 :])


def _merge_axes(x, axis: int, count: int):
    return x.reshape(x.shape[:axis] + (-1,) + x.shape[axis + count :])


def cyclic_1d_no_shardmap(x, T_A: int, axis_name: str, axis: int = 1):
    """Relayout a local shard, inside ``shard_map``, to the 1D block-cyclic layout.

    Args:
        x: this device's block of the matrix; ``x.shape[axis]`` is the shard size ``s``.
        T_A: tile width. ``T_A >= s`` needs no relayout and returns ``x`` unchanged.
        axis_name: the mesh axis the matrix is sharded over.
        axis: the sharded axis of ``x`` (1: column sharding, 0: row sharding).

    Returns:
        The local block of width ``L = ceil(s/tile)*tile`` along ``axis``: local slot ``m``
        holds global tile ``axis_index + m*ndev``; zeros after the last real tile.
    """
    axis = _axis(x, axis)
    ndev = lax.axis_size(axis_name)
    s = x.shape[axis]
    plan = CyclicPlan.make(s * ndev, ndev, T_A)
    if not plan.needs_relayout:
        return x
    if not plan.shift_relayout:
        return _gather_exchange(x, _forward_tables(plan), axis_name, axis)
    t, p = plan.tile, plan.padding
    d = lax.axis_index(axis_name)
    # 1. shift: padding to the global right edge.
    if p:
        pieces = [x]
        if ndev > 1:
            head = lax.slice_in_dim(x, 0, (ndev - 1) * p, axis=axis)
            pieces.append(lax.ppermute(head, axis_name, [(e, e - 1) for e in range(1, ndev)]))
        pieces.append(_zeros_like_along(x, axis, p))
        x = lax.dynamic_slice_in_dim(jnp.concatenate(pieces, axis=axis), d * p, s + p, axis=axis)
    # 2. exchange: column group j of every device goes to device j.
    blocks = (s + p) // (ndev * t)
    grouped = _split_axis(x, axis, (blocks, ndev, t))
    if ndev > 1:
        grouped = lax.all_to_all(grouped, axis_name, axis + 1, axis)  # (ndev_src, blocks, t)
    else:
        grouped = jnp.swapaxes(grouped, axis, axis + 1)
    # 3. drop the trailing all-padding slots.
    return lax.slice_in_dim(_merge_axes(grouped, axis, 3), 0, plan.local_width, axis=axis)


def undo_cyclic_1d_no_shardmap(x_bc, T_A: int, N: int, axis_name: str, axis: int = 1):
    """Inverse of :func:`cyclic_1d_no_shardmap`: back to block sharding of an ``N x N`` matrix.

    ``x_bc.shape[axis]`` must be the layout's local width ``L``; returns the block of width
    ``N // ndev`` along ``axis``.
    """
    axis = _axis(x_bc, axis)
    ndev = lax.axis_size(axis_name)
    plan = CyclicPlan.make(N, ndev, T_A)
    if x_bc.shape[axis] != plan.local_width:
        raise ValueError(
            f"the block-cyclic shard has {x_bc.shape[axis]} entries along axis {axis}, but N={N}"
            f" on {ndev} devices with T_A={T_A} has local width {plan.local_width}."
        )
    if not plan.needs_relayout:
        return x_bc
    if not plan.shift_relayout:
        return _gather_exchange(x_bc, _backward_tables(plan), axis_name, axis)
    s, t, p = plan.shard_size, plan.tile, plan.padding
    blocks = (s + p) // (ndev * t)
    d = lax.axis_index(axis_name)
    # 2'. exchange back: slot d*blocks + b returns to device d as column group (b, j).
    x = jnp.concatenate([x_bc, _zeros_like_along(x_bc, axis, s + p - plan.local_width)], axis)
    grouped = _split_axis(x, axis, (ndev, blocks, t))
    if ndev > 1:
        grouped = lax.all_to_all(grouped, axis_name, axis, axis + 1)  # (blocks, ndev, t)
    else:
        grouped = jnp.swapaxes(grouped, axis, axis + 1)
    x = _merge_axes(grouped, axis, 3)
    if not p:
        return x
    # 1'. shift back: device d takes the last d*p columns of device d-1.
    pieces = [x]
    if ndev > 1:
        tail = lax.slice_in_dim(x, s + p - (ndev - 1) * p, s + p, axis=axis)
        received = lax.ppermute(tail, axis_name, [(e, e + 1) for e in range(ndev - 1)])
        pieces = [received, x]
    start = (ndev - 1) * p - d * p
    return lax.dynamic_slice_in_dim(jnp.concatenate(pieces, axis=axis), start, s, axis=axis)


@functools.lru_cache(maxsize=64)
def _forward_tables(plan: CyclicPlan):
    """Index tables of the general relayout, block -> cyclic (see :func:`_gather_exchange`)."""
    s, t, ndev = plan.shard_size, plan.tile, plan.ndev
    source = np.arange(ndev)[:, None]
    column = np.arange(s)[None, :]
    k, offset = np.divmod(source * s + column, t)  # global tile of each local column
    dest, dest_col = np.broadcast_to(k % ndev, k.shape), (k // ndev) * t + offset
    return _grouped(_tables(dest, dest_col, plan.local_width, ndev), math.gcd(s, t))


@functools.lru_cache(maxsize=64)
def _backward_tables(plan: CyclicPlan):
    """Index tables of the general relayout, cyclic -> block."""
    cmap = plan.column_map()  # [ndev, L]: global column or -1
    dest = np.where(cmap >= 0, cmap // plan.shard_size, -1)
    tables = _tables(
        dest, np.where(cmap >= 0, cmap % plan.shard_size, -1), plan.shard_size, plan.ndev
    )
    return _grouped(tables, math.gcd(plan.shard_size, plan.tile))


def _grouped(tables, g):
    """The tables in units of ``g`` consecutive columns, which always move together.

    Every boundary the relayout cuts at (shard edges, tile edges) is a multiple of
    ``g = gcd(shard size, tile)``, so the gathers can move whole groups of ``g`` columns
    (contiguous rows of ``g * N`` entries in the row form) instead of single columns.
    """
    send, recv, shifts = tables
    ndev = send.shape[0]
    send_g = send.reshape(ndev, -1, g)
    recv_g = recv.reshape(ndev, -1, g)
    real = send_g[..., 0] >= 0
    assert (send_g[real] - send_g[real][:, :1] == np.arange(g)).all()
    assert (send_g[real] % g == np.arange(g)).all()
    assert ((recv_g < 0) == (recv_g[..., :1] < 0)).all()
    assert all(start % g == 0 and count % g == 0 for _, start, count, _ in shifts)
    return _ExchangeTables(
        send=np.where(real, send_g[..., 0] // g, 0).astype(np.int32),
        recv=np.where(recv_g[..., 0] >= 0, recv_g[..., 0] // g, -1).astype(np.int32),
        shifts=tuple((k, start // g, count // g, pairs) for k, start, count, pairs in shifts),
        group=g,
    )


@dataclasses.dataclass(frozen=True)
class _ExchangeTables:
    """What :func:`_gather_exchange` needs, in units of ``group`` columns.

    ``send[d]``: the local groups device ``d`` sends, shift after shift; ``shifts``: one
    ``(k, start, count, pairs)`` per shift ``k`` that moves anything, its slice of ``send[d]``
    and the ``(source, target)`` pairs with ``target = (source + k) % ndev`` that have data;
    ``recv[j, l]``: where output group ``l`` of device ``j`` sits in what ``j`` received
    (``-1``: a zero group).
    """

    send: np.ndarray
    recv: np.ndarray
    shifts: tuple
    group: int


def _tables(dest, dest_col, out_width, ndev):
    """From "column c of device d goes to column dest_col[d, c] of device dest[d, c]" (-1: drop).

    The exchange runs shift by shift: in shift ``k`` every device ``d`` sends to device
    ``(d + k) % ndev`` (shift 0 stays local). Shift ``k`` carries ``q_k`` columns per device,
    the most any source sends at that shift, and involves only the pairs that send something,
    so nothing moves for pairs that share no columns (an ``all_to_all`` would move padding
    between every pair).
    """
    counts = np.zeros((ndev, ndev), np.int64)
    for d in range(ndev):
        counts[d] = np.bincount(dest[d][dest[d] >= 0], minlength=ndev)
    sources = np.arange(ndev)
    shifts, start = [], 0
    for k in range(ndev):
        per_source = counts[sources, (sources + k) % ndev]
        if per_source.max() > 0:
            pairs = tuple((int(d), int((d + k) % ndev)) for d in sources if per_source[d] > 0)
            shifts.append((k, start, int(per_source.max()), pairs))
            start += int(per_source.max())
    send = np.full((ndev, max(start, 1)), -1, np.int32)  # -1: filler, never read back
    recv = np.full((ndev, out_width), -1, np.int32)
    for _, offset, _, pairs in shifts:
        for d, j in pairs:
            cols = np.flatnonzero(dest[d] == j)  # ascending local column order
            send[d, offset : offset + cols.size] = cols
            recv[j, dest_col[d, cols]] = offset + np.arange(cols.size)
    return send, recv, tuple(shifts)


def _gather_exchange(x, tables, axis_name, axis):
    """The general relayout, valid for every tile size: select, one ``ppermute`` per shift, select.

    For each shift ``k`` each device selects the column groups it owes device ``d + k`` and one
    ``ppermute`` over the pairs that have data delivers them; a second selection puts the
    received groups in their final order (zeros for padding). Index tables are numpy constants.
    """
    g = tables.group
    d = lax.axis_index(axis_name)
    groups = _split_axis(x, axis, (x.shape[axis] // g, g))
    received = []
    for k, start, count, pairs in tables.shifts:
        piece = _select(groups, tables.send[:, start : start + count], d, axis)
        received.append(piece if k == 0 else lax.ppermute(piece, axis_name, list(pairs)))
    where = tables.recv
    if (where < 0).any():  # padding groups point at one appended zero group: no select
        received.append(_zeros_like_along(groups, axis, 1))
        where = np.where(where >= 0, where, sum(count for _, _, count, _ in tables.shifts))
    buffer = jnp.concatenate(received, axis=axis) if len(received) > 1 else received[0]
    return _merge_axes(_select(buffer, where.astype(np.int32), d, axis), axis, 2)


_SLICED_SELECT_MAX = 32


def _select(x, table, d, axis):
    """``x`` indexed along ``axis`` by row ``d`` (this device) of the numpy ``table``.

    A short table (the usual case: a few tiles per device) becomes one dynamic slice per entry,
    each a contiguous block copy; a long one becomes one XLA gather, so the program stays small.
    """
    rows = jnp.asarray(table)[d]
    if table.shape[1] > _SLICED_SELECT_MAX:
        return jnp.take(x, rows, axis=axis, mode="clip")
    picks = [lax.dynamic_slice_in_dim(x, rows[i], 1, axis=axis) for i in range(table.shape[1])]
    return jnp.concatenate(picks, axis=axis)


def _sharded_axis(sharding, caller: str) -> tuple[int, str]:
    """(array axis, mesh axis name) of a matrix sharded over exactly one mesh axis."""
    if not isinstance(sharding, NamedSharding):
        raise TypeError(
            f"{caller}: the array must carry a NamedSharding over a mesh, sharded by columns "
            f"P(None, ax) or rows P(ax, None); got {sharding!r}. Place it with "
            "jax.device_put(a, NamedSharding(mesh, P(None, 'x')))."
        )
    spec = tuple(sharding.spec) + (None,) * (2 - len(sharding.spec))
    sharded = [(i, entry) for i, entry in enumerate(spec) if entry is not None]
    names = []
    for _, entry in sharded:
        names.extend(entry if isinstance(entry, tuple) else (entry,))
    if len(sharded) != 1 or len(names) != 1:
        raise ValueError(
            f"{caller}: the matrix must be sharded over exactly one mesh axis, by columns "
            f"P(None, ax) or by rows P(ax, None); got {sharding.spec}."
        )
    return sharded[0][0], names[0]


def _sharding_of(a, sharding, caller: str):
    if sharding is not None:
        return sharding
    if not isinstance(a, jax.Array):
        raise TypeError(
            f"{caller}: expected a jax.Array sharded over a mesh, got {type(a).__name__}. Place it "
            "with jax.device_put(a, NamedSharding(mesh, P(None, 'x')))."
        )
    concrete = getattr(a, "sharding", None)
    if isinstance(concrete, NamedSharding):
        return concrete
    typed = getattr(jax.typeof(a), "sharding", None)
    if typed is not None and typed.mesh.shape_tuple and any(e is not None for e in typed.spec):
        return NamedSharding(typed.mesh, typed.spec)
    if concrete is None:
        raise ValueError(
            f"{caller}: cannot read the sharding of a traced array on a mesh with Auto axes; pass "
            "sharding=NamedSharding(mesh, spec), or use a mesh with Explicit axes."
        )
    return concrete  # _sharded_axis explains what is wrong with it


@functools.partial(jax.jit, static_argnames=("T_A", "N", "mesh", "spec", "axis", "undo"))
def _global(a, *, T_A, N, mesh, spec, axis, undo):
    name = spec[axis]

    def local(x):
        if undo:
            return undo_cyclic_1d_no_shardmap(x, T_A, N, name, axis=axis)
        return cyclic_1d_no_shardmap(x, T_A, name, axis=axis)

    return jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)(a)


def _spec2(spec) -> P:
    return P(*(tuple(spec) + (None,) * (2 - len(spec))))


def cyclic_1d_layout(a: jax.Array, T_A: int, *, sharding: NamedSharding | None = None) -> jax.Array:
    """Relayout a sharded ``N x N`` matrix to the 1D block-cyclic layout of cuSolverMg.

    Args:
        a: square ``jax.Array`` sharded over one mesh axis ``ax``, by columns ``P(None, ax)``
            or by rows ``P(ax, None)``; other mesh axes replicate it. Mesh and axis are read
            from ``a.sharding``.
        T_A: tile width. ``T_A >= N / ndev`` needs no relayout: ``a`` is returned as is.
        sharding: only needed under ``jax.jit`` on a mesh with Auto axes, where the sharding
            of a traced array is unknown.

    Returns:
        An ``N x ndev*L`` (columns) or ``ndev*L x N`` (rows) array with the same sharding:
        device ``j`` holds, in local slot ``m``, global tile ``j + m*ndev``, then zeros.

    Raises:
        ValueError: non-square ``a``, a sharding over other than exactly one mesh axis, or
            an invalid ``T_A`` (the message names the nearest valid ones).
    """
    sharding = _sharding_of(a, sharding, "cyclic_1d_layout")
    axis, name = _sharded_axis(sharding, "cyclic_1d_layout")
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"cyclic_1d_layout: a must be a square matrix, got shape {a.shape}.")
    N = a.shape[0]
    ndev = sharding.mesh.shape[name]
    if not CyclicPlan.make(N, ndev, T_A).needs_relayout:
        return a
    return _global(
        a,
        T_A=int(T_A),
        N=N,
        mesh=sharding.mesh,
        spec=_spec2(sharding.spec),
        axis=axis,
        undo=False,
    )


def undo_cyclic_1d_layout(
    a_bc: jax.Array, T_A: int, N: int | None = None, *, sharding: NamedSharding | None = None
) -> jax.Array:
    """Inverse of :func:`cyclic_1d_layout`: the ``N x N`` matrix in block sharding again.

    ``N`` left out (jaxmg 0.0.1's call ``undo_cyclic_1d_layout(a_bc, T_A)``) is read from the
    axis that is not sharded, which the relayout leaves ``N`` long.
    """
    sharding = _sharding_of(a_bc, sharding, "undo_cyclic_1d_layout")
    axis, name = _sharded_axis(sharding, "undo_cyclic_1d_layout")
    ndev = sharding.mesh.shape[name]
    if N is None:
        if a_bc.ndim != 2:
            raise ValueError(
                f"undo_cyclic_1d_layout: a_bc must be a matrix, got shape {tuple(a_bc.shape)}."
            )
        N = a_bc.shape[1 - axis]
    plan = CyclicPlan.make(N, ndev, T_A)
    expected = [N, N]
    expected[axis] = ndev * plan.local_width
    if a_bc.ndim != 2 or tuple(a_bc.shape) != tuple(expected):
        raise ValueError(
            f"undo_cyclic_1d_layout: for N={N}, T_A={T_A} on {ndev} devices the block-cyclic "
            f"array has shape {tuple(expected)}, got {tuple(a_bc.shape)}."
        )
    return _global(
        a_bc,
        T_A=int(T_A),
        N=int(N),
        mesh=sharding.mesh,
        spec=_spec2(sharding.spec),
        axis=axis,
        undo=True,
    )
