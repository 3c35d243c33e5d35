"""The block <-> block-cyclic relayout as a list of in-place column-range moves.

A native executor that can reach every device's buffer (the leader of a jaxmg call) permutes
the columns in place instead of through JAX collectives: no second copy of ``A``, only a
staging buffer of about one tile per device. This module computes
*what* moves; the executor only copies ranges, so the index math lives here, next to
:class:`CyclicPlan`, and is tested here.

Positions. Every device's buffer has ``W = width`` columns (``W >= L``, the layout's local
width); position ``p = d * W + j`` is local column ``j`` of device ``d`` (in mesh order). In
the block layout device ``d`` keeps its ``s`` columns at ``offsets[d] .. offsets[d] + s``,
with ``offsets[d] = (d * s) % tile``: every column then sits at its offset within its tile,
as it will in the block-cyclic layout, so tiles move whole (a tile split between two devices
moves as two pieces) and the staging buffer stays near one tile. ``W`` is one tile wider
than ``L`` where that needs the room (``s`` not a multiple of the tile). In the block-cyclic
layout global column ``c`` sits at ``(k % ndev) * W + (k // ndev) * tile + c % tile`` with
``k = c // tile``.

Moves. A move ``(round, source, destination, width)`` copies ``width`` whole columns from one
position range to another. Positions ``ndev * W + d * W + j`` are column ``j`` of device
``d``'s staging buffer (at most ``staging_width`` columns). Executed round after round,
the moves take every real column to its new position; padding positions end up holding
unspecified values. Within one move the two ranges never overlap and each lies on one device;
the moves of one round touch disjoint ranges (none reads or writes what another one writes),
so an executor may run them at once. Columns move in pieces, the ranges contiguous in both
layouts (split at multiples of the shard size and of the tile), so whole tiles move as one copy.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ._plan import CyclicPlan

__all__ = ["InPlaceMoves", "in_place_moves"]


@dataclasses.dataclass(frozen=True)
class InPlaceMoves:
    """The moves of one relayout, both ways, and the buffers they need.

    Attributes:
        width: ``W``, columns of every device's buffer.
        offsets: ``int64 [ndev]``, where device ``d``'s block starts in its buffer.
        to_cyclic: ``int64 [m, 4]`` moves ``(round, source, destination, width)``, block ->
            cyclic, in round order.
        from_cyclic: ``int64 [m', 4]``, block-cyclic -> block.
        staging_width: the most columns of any device's staging buffer the moves use (device
            ``d``'s: positions ``(ndev + d) * W ..``; 0: none).
    """

    width: int
    offsets: np.ndarray
    to_cyclic: np.ndarray
    from_cyclic: np.ndarray
    staging_width: int


def _pieces(plan: CyclicPlan) -> np.ndarray:
    """Starts of the column ranges that stay contiguous in both layouts (and N at the end)."""
    cuts = np.union1d(
        np.arange(0, plan.N, plan.shard_size, dtype=np.int64),
        np.arange(0, plan.N, plan.tile, dtype=np.int64),
    )
    return np.append(cuts, plan.N)


class _Staging:
    """Each device's staging buffer (positions ``ndev * W + d * W ..``), first fit, and the
    most columns any device's buffer holds at once."""

    def __init__(self, ndev: int, width: int):
        self.base, self.width = ndev * width, width
        self.used: list[list[tuple[int, int]]] = [[] for _ in range(ndev)]  # (offset, width)
        self.peak = 0

    def take(self, width: int, device: int) -> int:
        offset = 0
        for used_offset, used_width in self.used[device]:
            if offset + width <= used_offset:
                break
            offset = max(offset, used_offset + used_width)
        self.used[device] = sorted(self.used[device] + [(offset, width)])
        self.peak = max(self.peak, offset + width)
        return self.base + device * self.width + offset

    def give(self, position: int) -> None:
        device, offset = divmod(position - self.base, self.width)
        self.used[device] = [u for u in self.used[device] if u[0] != offset]


def _moves(source: np.ndarray, destination: np.ndarray, starts: np.ndarray, ndev: int, W: int):
    """Moves taking the column at ``source[c]`` to ``destination[c]`` for every column c.

    Pieces (column ranges contiguous in both layouts) move whole. A piece may be written once
    every other piece whose source range its destination overlaps has been read. When no piece
    can go (only cycles are left), the pieces blocking up to ``ndev`` unwritten ones, spread
    over them, are read into the staging buffer of the device that holds them, and written
    from there when their turn comes: each cycle is cut into about ``ndev`` chains that can
    move at the same time (see :func:`_rounds`). A piece whose source and destination overlap
    goes through staging too. Returns ``(moves [m, 3], staging columns per device)``.
    """
    lo, hi = starts[:-1], starts[1:]
    width = hi - lo
    src, dst = source[lo], destination[lo]
    count = len(lo)
    order = np.argsort(src)
    ends = np.searchsorted(src[order], dst + width)
    waits_on: list[set[int]] = [set() for _ in range(count)]
    waiters: list[list[int]] = [[] for _ in range(count)]
    for i in range(count):
        # Sources are disjoint: the ones overlapping [dst, dst + width) end the run order[:end].
        for j in map(int, order[: ends[i]][::-1]):
            if src[j] + width[j] <= dst[i]:
                break
            if j != i:
                waits_on[i].add(j)
                waiters[j].append(i)
    staging = _Staging(ndev, W)
    stashed: dict[int, int] = {}
    done = np.zeros(count, dtype=bool)
    released = np.zeros(count, dtype=bool)
    moves: list[tuple[int, int, int]] = []

    def release(j: int, ready: list[int]) -> None:
        released[j] = True
        for i in waiters[j]:
            waits_on[i].discard(j)
            if not waits_on[i] and not done[i]:
                ready.append(i)

    ready = [i for i in range(count) if not waits_on[i]]
    remaining = count
    while remaining:
        if not ready:
            # Only cycles are left: stash what blocks up to ndev unwritten pieces, spread out,
            # where the blockers' devices have empty staging (always for the first).
            unwritten = np.flatnonzero(~done)
            spread = np.linspace(0, len(unwritten) - 1, min(ndev, len(unwritten)))
            for piece in dict.fromkeys(unwritten[spread.astype(np.int64)].tolist()):
                blockers = sorted(waits_on[piece])
                if ready and any(staging.used[int(src[j]) // W] for j in blockers):
                    continue
                for j in blockers:
                    stashed[j] = staging.take(int(width[j]), int(src[j]) // W)
                    moves.append((int(src[j]), stashed[j], int(width[j])))
                    release(j, ready)
            continue
        i = ready.pop()
        if done[i]:
            continue
        done[i] = True
        remaining -= 1
        w = int(width[i])
        if i in stashed:
            moves.append((stashed[i], int(dst[i]), w))
            staging.give(stashed[i])
        elif src[i] != dst[i]:
            if abs(int(src[i]) - int(dst[i])) < w:  # overlaps itself: through staging
                at = staging.take(w, int(src[i]) // W)
                moves += [(int(src[i]), at, w), (at, int(dst[i]), w)]
                staging.give(at)
            else:
                moves.append((int(src[i]), int(dst[i]), w))
        if not released[i]:
            release(i, ready)
    return np.asarray(moves, dtype=np.int64).reshape(-1, 3), staging.peak


def _rounds(moves: np.ndarray) -> np.ndarray:
    """``moves`` (an order that works one at a time) grouped into rounds: each move goes one
    round after the last earlier move it conflicts with (one writes what the other reads or
    writes). Returns ``[m, 4]`` rows ``(round, source, destination, width)``, sorted by round
    (stable, so conflicting moves keep their order)."""
    src, dst, width = moves[:, 0], moves[:, 1], moves[:, 2]
    level = np.zeros(len(moves), dtype=np.int64)

    def overlaps(start, count, starts, counts):
        return (start < starts + counts) & (starts < start + count)

    for i in range(1, len(moves)):
        before = slice(0, i)
        conflict = (
            overlaps(dst[i], width[i], src[before], width[before])  # writes what they read
            | overlaps(dst[i], width[i], dst[before], width[before])  # or what they write
            | overlaps(src[i], width[i], dst[before], width[before])  # reads what they write
        )
        if conflict.any():
            level[i] = level[before][conflict].max() + 1
    order = np.argsort(level, kind="stable")
    return np.column_stack([level, moves])[order]


@functools.lru_cache(maxsize=64)
def in_place_moves(plan: CyclicPlan) -> InPlaceMoves:
    """The in-place moves between block sharding and the block-cyclic layout of ``plan``.

    No moves when the plan needs no relayout (the block layout is already cyclic). Cached per
    plan; the arrays are read-only.
    """
    ndev, s, t = plan.ndev, plan.shard_size, plan.tile
    offsets = (np.arange(ndev, dtype=np.int64) * s) % t
    if not plan.needs_relayout:
        empty = np.zeros((0, 4), dtype=np.int64)
        return InPlaceMoves(plan.local_width, offsets, empty, empty, 0)
    c = np.arange(plan.N, dtype=np.int64)
    d, k = c // s, c // t
    local = offsets[d] + c - d * s
    width = max(int(local.max()) // t + 1, plan.tiles_per_device) * t
    block = d * width + local
    cyclic = (k % ndev) * width + (k // ndev) * t + c % t
    starts = _pieces(plan)
    forward, w1 = _moves(block, cyclic, starts, ndev, width)
    backward, w2 = _moves(cyclic, block, starts, ndev, width)
    forward, backward = _rounds(forward), _rounds(backward)
    for table in (offsets, forward, backward):
        table.flags.writeable = False
    return InPlaceMoves(width, offsets, forward, backward, max(w1, w2))
