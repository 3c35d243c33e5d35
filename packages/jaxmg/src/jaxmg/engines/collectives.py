"""Backend ``"jax"`` on several devices: Cholesky, LU and their solves in XLA's own collectives.

Every cross-device step is a ``lax.psum`` over the solver's mesh axis inside the program's
``jax.shard_map``; there is no native target, so the engine runs wherever JAX runs (any
platform, one process or one per device), fuses with the caller's program, and ``jax.vmap`` and
derivatives come from JAX.

The operand contract is the native engines' (packages/jaxmg-cuda/README.md): each device holds
``a`` ``[L, N]``, the column-major storage of its column tiles of the matrix ``M`` the solver
sees, the layout's tile ``K`` (of ``T`` columns) on device ``K mod p`` at local slot
``K // p``. The layout's tile divides ``N / p`` (:meth:`CollectiveEngine.tile`), so there is no
padding, and by default it is ``N / p``: JAX's own blocks, which no relayout moves.

The engine's order. The engine steps through tiles of its own, ``t`` dividing ``T``
(:func:`_inner`: at most a quarter of a device's columns, so that a step's panel is small
beside the block), and takes them block-cyclically over the devices whatever ``T``: step ``k``
is local tile ``k // p`` of device ``k mod p``, which is ``M``'s tile ``_order[k]``
(:func:`_order`; the identity where ``t = T``). So it factors a permutation of ``M`` in which
every device holds its columns where JAX put them: Cholesky ``M' = Pi M Pi^T`` (its rows
permuted in each device's own storage, and back at the end), LU ``B = M Pi^T`` (nothing moves);
the solves place each tile where ``M`` has it. LAPACK's ``info`` (and LU's pivots) are those
of ``M'`` (``B``): ``M``'s own where ``t = T``.

Cholesky (:func:`potrf`): right-looking, one tile of columns at a time, in a ``lax.fori_loop``
per bucket of steps (:func:`_buckets`): a bucket's steps share the static shapes of its first
step's trailing matrix, so the flops stay within ``1 / SHRINK^2`` of ``N^3 / (3 p)`` per device
while the program holds one loop body per bucket, not one per tile. Step ``k``: the owner of tile
``k`` factors its diagonal block and solves the tile below it, the result reaches every device in
one ``psum``, and each device updates its own later tiles with a few GEMMs (:func:`_chunks`, the
staircase of the lower triangle). ``info`` is LAPACK's: the order of the first leading minor that
is not positive definite, found inside the failing diagonal block
(:func:`jaxmg.engines.dense._cholesky`); the factor is then NaN.

LU (:func:`getrf`): right-looking with partial pivoting, bucketed the same way. A tile of
columns lives on one device, so its panel's pivot search is local (``lax.linalg.lu`` of the
panel on its owner); the factored panel and its pivots reach every device in one ``psum``, each
device applies the interchanges to its columns (at most ``2 t`` rows move per step), solves its
row tile of ``U`` and updates its trailing columns with one GEMM. Tournament pivoting (CALU)
would cut the panel's latency where one panel spans devices (a 2D grid); here it does not.

Solves (:func:`_sweep`): a triangular solve by tiles, each tile's solution from the sum over
every device's solved columns (``T x = y``: one ``psum`` of ``t x nrhs`` and the diagonal
block) or from the owner's column tile (``T^H x = y``). Cholesky solves go forward by rows and
back by columns; LU's ``N`` solve by rows both ways, ``T`` and ``C`` by columns. ``b`` and
``x`` are the same on every device. The inverse (:func:`potri_factored`) solves for one
device's columns of the identity at a time, each device keeping its own: ``2 N^3 / p`` flops
per device (LAPACK's ``?potri``: ``2 N^3 / 3`` in all), one block of right-hand side at a time.

The eigensolver (:func:`syevd`: ``syevd``, and the SVD, ``polar`` and ``lstsq`` through it) is
Householder tridiagonalisation in the same collectives, :mod:`jaxmg.engines.tridiagonal`.
"""

from __future__ import annotations

import functools
import math
import types

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..describe import processes
from . import dense, tridiagonal
from ._unbatched import unbatched
from .base import Engine

_HIGHEST = lax.Precision.HIGHEST

#: The widest tile the engine chooses by itself, and the most tiles (steps) it aims at; it
#: chooses tiles of at most ``1 / PANEL`` of each device's columns, since a step's panel
#: (``N x t``) and the temporaries made of it are held beside the block.
DEFAULT_TILE = 256
MAX_TILES = 64
PANEL = 4
#: How far a bucket's trailing order falls before the next bucket (:func:`_buckets`), the
#: trailing order under which the rest is one bucket, and the most GEMMs a step's trailing
#: update takes (:func:`_chunks`).
SHRINK = 0.9
SMALL = 512
CHUNKS = 8


def _mm(x, y):
    return jnp.matmul(x, y, precision=_HIGHEST)


@functools.lru_cache(maxsize=64)
def _columns(ndev: int, local: int, tile: int) -> np.ndarray:
    """``[ndev, local]``: the global column of each device's local column (tile ``k`` on device
    ``k mod ndev``, slot ``k // ndev``)."""
    devices = np.arange(ndev)[:, None]
    r = np.arange(local)[None, :]
    return (devices + (r // tile) * ndev) * tile + r % tile


def _owned(position, owner, x):
    """``x`` on the owner, zeros elsewhere: summed over the axis, the owner's ``x`` everywhere."""
    return jnp.where(position == owner, x, jnp.zeros_like(x))


def _buckets(steps: int, t: int, least: int = 2) -> list[tuple[int, int]]:
    """The steps ``[k0, k1)`` that share one loop body, with the static shapes of step ``k0``'s
    trailing matrix: a bucket ends once the trailing order has fallen to :data:`SHRINK` of its
    start's, so that a step does at most ``1 / SHRINK^2`` its own flops; from a trailing order
    of :data:`SMALL` (tiles of ``t``), where the flops are few and compiling a loop body per
    bucket is what costs, the rest is one bucket. A bucket has ``least`` steps at least: XLA
    unrolls a loop of one trip, and the unrolled steps' temporaries overlap (Cholesky at
    N = 2048 on 2 devices: 3.3 blocks of ``A`` with ``A`` donated, 2.1 with two); LU takes
    ``least=1``, as its unrolled steps run faster (N = 4096 on 4 CPU devices: 2.3 s against
    3.1 s in loops of two) and hold no more."""
    out, k0 = [], 0
    while k0 < steps:
        small = (steps - k0) * t <= SMALL
        k1 = steps if small else max(k0 + least, math.ceil(steps - SHRINK * (steps - k0)))
        k1 = steps if steps - k1 < least else k1  # no shorter bucket left at the end
        out.append((k0, k1))
        k0 = k1
    return out


def _chunks(first: int, slots: int) -> list[tuple[int, int]]:
    """The local slots ``[first, slots)`` in at most :data:`CHUNKS` runs: each run is one GEMM
    whose columns start at its first slot's (the staircase of the lower triangle)."""
    bounds = np.linspace(first, slots, min(CHUNKS, slots - first) + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def _inner(T: int, n: int, ndev: int) -> int:
    """The engine's own tile inside the layout's tile ``T``: the widest divisor of ``T`` up to
    :data:`DEFAULT_TILE` and ``1 / PANEL`` of each device's columns, or wider where ``N``
    would take more than :data:`MAX_TILES` tiles."""
    cap = max(min(DEFAULT_TILE, max(n // ndev // PANEL, 1)), -(-n // MAX_TILES))
    return max(t for t in range(1, min(cap, T) + 1) if T % t == 0)


@functools.lru_cache(maxsize=64)
def _order(n: int, ndev: int, T: int, t: int) -> np.ndarray:
    """``[N / t]``: the tile of ``M`` the engine takes at step ``k``. The layout's tile ``T``
    holds ``r = T / t`` of the engine's; local tile ``j`` of device ``d`` is the engine's tile
    ``j p + d`` (block-cyclic over the devices, whatever ``T``) and ``M``'s tile ``((j // r) p
    + d) r + j % r``. The identity where ``r = 1``."""
    k = np.arange(n // t)
    r, d, j = T // t, k % ndev, k // ndev
    return ((j // r) * ndev + d) * r + j % r


def _rows(n: int, ndev: int, T: int, t: int) -> np.ndarray:
    """``[N]``: the row (or column) of ``M`` at each row of the engine's order."""
    return (_order(n, ndev, T, t)[:, None] * t + np.arange(t)).ravel()


@functools.lru_cache(maxsize=64)
def _cycles(order: tuple[int, ...]) -> np.ndarray:
    """``[m, 2]``: the steps ``(tile, write)`` that put tile ``order[i]`` at tile ``i``, one cycle
    of the permutation at a time: a step takes the tile at ``tile`` and, where ``write``, puts
    the tile taken by the step before in its place. A cycle ``c0 -> c1 -> ... -> cl`` (``ci``
    takes ``c(i+1)``'s tile, ``cl`` takes ``c0``'s) is ``c0`` unwritten, then ``cl`` down to
    ``c0`` written."""
    steps, seen = [], [False] * len(order)
    for first in range(len(order)):
        if seen[first] or order[first] == first:
            continue
        cycle, i = [], first
        while not seen[i]:
            seen[i] = True
            cycle.append(i)
            i = order[i]
        steps += [(first, 0)] + [(i, 1) for i in reversed(cycle)]
    return np.asarray(steps, np.int32).reshape(-1, 2)


def _permute_rows(f, order, t):
    """``f`` with its tiles of ``t`` columns (rows of the matrix it stores) in ``order``: column
    tile ``i`` becomes ``f``'s tile ``order[i]``. In place, one tile at a time along the cycles of
    the permutation (:func:`_cycles`), so that nothing of ``f``'s size is held twice: each step
    writes the tile it holds and reads the next step's tile from what it wrote, so no read of
    ``f`` waits on a write to it (else XLA copies ``f``)."""
    steps = _cycles(tuple(int(i) for i in order))
    if not len(steps):
        return f
    table = jnp.asarray(steps)

    def step(i, carry):
        f, held, here = carry  # here: the tile at step i's place, taken before it is written
        place, write = table[i, 0], table[i, 1]
        f = lax.dynamic_update_slice_in_dim(f, jnp.where(write == 1, held, here), place * t, 1)
        following = table[jnp.minimum(i + 1, len(steps) - 1), 0]
        return f, here, lax.dynamic_slice_in_dim(f, following * t, t, axis=1)

    first = lax.dynamic_slice_in_dim(f, int(steps[0, 0]) * t, t, axis=1)
    return lax.fori_loop(0, len(steps), step, (f, jnp.zeros_like(first), first))[0]


def potrf(a, position, *, axis, ndev, T_A, **_):
    """The Cholesky factor, distributed: ``(factor, status)`` as ``jaxmg_cuda.mg_potrf``: of
    ``M' = Pi M Pi^T``, the engine's order of ``M``'s tiles (:func:`_order`), whose rows each
    device permutes in its own storage first and back at the end, in place
    (:func:`_permute_rows`; no communication), so that its factor's columns and rows are where
    ``M``'s are.

    A ``lax.fori_loop`` per bucket of steps (:func:`_buckets`); step ``k`` of a bucket
    starting at ``k0``, whose trailing window is the columns from ``c0 = k0 t`` and this
    device's slots from ``k0 // p``:

    1. the owner of tile ``k`` factors its diagonal block and solves the tile below it (under
       ``lax.cond``: the other devices skip it) into ``X = L[c0:, tile k]``, zero above row
       ``k t``;
    2. ``X`` reaches every device in one ``psum``;
    3. every device subtracts ``conj(X[g]) X^T`` from each of its later columns ``g`` in its
       window, in :func:`_chunks` (the zero rows of ``X`` leave every finished column as it
       is; what lands above the diagonal is zeroed at the end), and the owner stores ``X``.
    """
    local, n = a.shape
    t = _inner(T_A, n, ndev)
    order = _order(n, ndev, T_A, t)  # the identity where t = T_A: nothing moves
    a = _permute_rows(a, order, t)
    steps, slots = n // t, local // t
    dtype = a.dtype
    mine = jnp.asarray(_columns(ndev, local, t))[position]  # this device's global columns

    def body(k0, k, carry):
        f, info = carry
        owner, slot, lo = k % ndev, k // ndev, k * t
        c0, s0 = k0 * t, k0 // ndev
        width = n - c0
        rows = jnp.arange(width)[:, None] + c0  # X's global rows

        def factor(f):
            raw = lax.dynamic_slice(f, (slot * t, c0), (t, width)).T  # M[c0:, tile k]
            block = lax.dynamic_slice(raw, (lo - c0, 0), (t, t))
            diagonal, failed = unbatched(dense._cholesky, block)
            x = unbatched(
                lax.linalg.triangular_solve,
                diagonal,
                raw,
                left_side=False,
                lower=True,
                transpose_a=True,
                conjugate_a=True,
            )
            x = lax.dynamic_update_slice(jnp.where(rows >= lo, x, 0), diagonal, (lo - c0, 0))
            return x, jnp.where(failed > 0, lo + failed, 0).astype(jnp.int32)

        def skip(f):  # typed as factor's outputs: varying where f does
            return dense._varying_like((jnp.zeros((width, t), dtype), jnp.int32(0)), f)

        x, failed = lax.cond(position == owner, factor, skip, f)
        info = jnp.where((info == 0) & (failed > 0), failed, info)
        x = lax.psum(x, axis)  # L[c0:, tile k], zero above row lo
        # X at this device's later columns (its slots s >= s0 hold tiles s p + position),
        # the diagonal block's rows zero (the owner's own tile k is stored below)
        left = jnp.take(x, jnp.clip(mine[s0 * t :] - c0, 0, width - 1), axis=0)
        left = jnp.conj(jnp.where(mine[s0 * t :, None] >= lo + t, left, 0))
        for first, last in _chunks(s0, slots):
            start = max(c0, first * ndev * t)
            update = _mm(left[(first - s0) * t : (last - s0) * t], x[start - c0 :].T)
            f = f.at[first * t : last * t, start:].add(-update)
        here = lax.dynamic_slice(f, (slot * t, c0), (t, width))
        f = lax.dynamic_update_slice(f, jnp.where(position == owner, x.T, here), (slot * t, c0))
        return f, info

    carry = (a, dense._varying_like(jnp.int32(0), a))
    for k0, k1 in _buckets(steps, t):
        carry = lax.fori_loop(k0, k1, functools.partial(body, k0), carry)
    f, info = carry
    info = _first_failure(info, axis, n)  # each device knows those of its own tiles
    f = _permute_rows(f, np.argsort(order), t)
    # the factor is lower: zero what the loop left of the upper triangle (columns before the
    # bucket that factored each tile), last, so that XLA does it in place
    column_of_row = jnp.asarray(_columns(ndev, local, t))[position][:, None]
    row = np.argsort(_rows(n, ndev, T_A, t))  # the engine's row at each of f's
    upper = jnp.asarray(row)[None, :] < column_of_row - column_of_row % t
    f = jnp.where(info == 0, jnp.where(upper, 0, f), jnp.full_like(f, jnp.nan))
    return f, info.reshape(1)


def _sweep(
    f, rhs, position, axis, ndev, t, *, by_rows, lower, at, unit=False, conj=False, back=False
):
    """``op(T)^-1 rhs`` for the triangular ``T`` whose column tiles are the distributed ``f``
    (``T``'s lower or upper triangle, ``lower``; unit diagonal, ``unit``), ``rhs`` ``[N, k]``
    and the result the same on every device: a ``lax.fori_loop`` over the tiles, forwards or
    ``back``wards, one ``psum`` of ``t x (k + t)`` per tile.

    ``by_rows``: ``op(T) = T``; tile ``k``'s partial sum is row tile ``k`` of ``T`` times the
    solution at each device's own columns (zero until solved), summed over the devices.
    Otherwise ``op(T) = T^T`` (``T^H`` with ``conj``), whose row tile ``k`` is ``T``'s column
    tile ``k``: its owner alone computes the partial sum. Either way the diagonal block comes
    from its owner in the same ``psum``.

    ``at`` says where tile ``k`` is: ``(rows, rhs, out)``, the first row of ``T``'s row tile
    ``k`` in ``f``'s storage, of ``rhs``'s tile ``k`` and of the result's, each ``[N / t]``
    (by columns the result is read with ``T``'s rows: ``out`` must be ``rows``).
    """
    local, n = f.shape
    steps, k_rhs = n // t, rhs.shape[1]
    rows_at, rhs_at, out_at = (jnp.asarray(v, jnp.int32) for v in at)

    def step(i, carry):
        y = carry[0]
        k = steps - 1 - i if back else i
        owner, slot = k % ndev, k // ndev
        column = lax.dynamic_slice_in_dim(f, slot * t, t)  # T[:, tile k]^T on its owner
        diagonal = lax.dynamic_slice_in_dim(column, rows_at[k], t, axis=1).T
        if by_rows:
            mine = carry[1]  # the solution at this device's columns
            partial = _mm(lax.dynamic_slice_in_dim(f, rows_at[k], t, axis=1).T, mine)
            send = jnp.concatenate([partial, _owned(position, owner, diagonal)], 1)
        else:
            partial = _mm(jnp.conj(column) if conj else column, y)
            send = _owned(position, owner, jnp.concatenate([partial, diagonal], 1))
        summed = lax.psum(send, axis)
        y_k = unbatched(
            lax.linalg.triangular_solve,
            summed[:, k_rhs:],
            lax.dynamic_slice_in_dim(rhs, rhs_at[k], t) - summed[:, :k_rhs],
            left_side=True,
            lower=lower,
            transpose_a=not by_rows,
            conjugate_a=conj,
            unit_diagonal=unit,
        )
        y = lax.dynamic_update_slice_in_dim(y, y_k, out_at[k], 0)
        if not by_rows:
            return (y,)
        here = lax.dynamic_slice_in_dim(mine, slot * t, t)
        mine = jnp.where(position == owner, y_k, here)
        return y, lax.dynamic_update_slice_in_dim(carry[1], mine, slot * t, 0)

    carry = (jnp.zeros_like(rhs),)
    if by_rows:
        carry += (dense._varying_like(jnp.zeros((local, k_rhs), rhs.dtype), f, rhs),)
    return lax.fori_loop(0, steps, step, carry)[0]


def _solve(f, rhs, position, axis, ndev, T):
    """``M^-1 rhs`` for the distributed Cholesky factor ``f`` of :func:`potrf` (``rhs`` ``[N,
    k]``, the same on every device): ``L' L'^H`` of ``M' = Pi M Pi^T``, whose tile ``k`` is
    ``M``'s tile ``_order[k]`` in ``f``'s rows, ``rhs`` and the result alike."""
    n = f.shape[1]
    t = _inner(T, n, ndev)
    at = (_order(n, ndev, T, t) * t,) * 3
    sweep = functools.partial(
        _sweep, f, position=position, axis=axis, ndev=ndev, t=t, lower=True, at=at
    )
    y = sweep(rhs, by_rows=True)
    return sweep(y, by_rows=False, conj=True, back=True)


def _each_devices_columns(solve, position, ndev, n, local, t, dtype):
    """``[L, N]``: on each device the storage of its columns of ``solve(I)`` (``solve`` maps
    ``[N, k]`` to ``[N, k]``, the same on every device), one device's ``L`` columns of the
    identity at a time, so that no device holds more than a block of the right-hand side."""
    columns = jnp.asarray(_columns(ndev, local, t))

    def one(d, inverse):
        unit = (jnp.arange(n)[:, None] == columns[d][None, :]).astype(dtype)  # I[:, d's]
        x = solve(unit).T
        return jnp.where(position == d, x, inverse)

    inverse = dense._varying_like(jnp.zeros((local, n), dtype), position)
    return lax.fori_loop(0, ndev, one, inverse)


def potri_factored(factor, position, *, axis, ndev, T_A, **_):
    """Inverse from a factor of :func:`potrf`: ``(inverse, status)``, the whole of each
    device's columns of ``M^-1`` (the caller reads its lower triangle)."""
    local, n = factor.shape
    solve = functools.partial(_solve, factor, position=position, axis=axis, ndev=ndev, T=T_A)
    inverse = _each_devices_columns(solve, position, ndev, n, local, T_A, factor.dtype)
    return inverse, jnp.zeros((1,), jnp.int32)


def potri(a, position, *, axis, ndev, T_A, **_):
    """Inverse from the Cholesky factor: ``(inverse, status)`` as ``jaxmg_cuda.mg_potri``."""
    f, status = potrf(a, position, axis=axis, ndev=ndev, T_A=T_A)
    inverse, _ = potri_factored(f, position, axis=axis, ndev=ndev, T_A=T_A)
    return inverse, status


def _first_failure(info, axis, n):
    """LAPACK's ``info`` (the first failure, 0 for none) from each device's first (or 0)."""
    never = jnp.int32(n + 1)
    info = lax.pmin(jnp.where(info > 0, info, never), axis)
    return jnp.where(info == never, 0, info)


def getrf(a, position, *, axis, ndev, T_A, **_):
    """LU with partial pivoting, distributed: ``(lu, pivots, status)`` as
    ``jaxmg_cuda.mg_getrf`` (LAPACK's ``L U`` in the tiles of ``a``, each device's 1-based
    ``ipiv`` of its own columns, ``info``: the first zero of ``U``'s diagonal).

    Right-looking, a ``lax.fori_loop`` per bucket of steps (:func:`_buckets`), whose trailing
    window is ``M``'s rows from ``c0 = k0 t`` and this device's slots from ``k0 // p``. Step
    ``k`` (tile ``k``'s columns live on one device, so the pivot search is local):

    1. the owner factors its panel's rows ``k t ..`` (``lax.linalg.lu`` of the window's height,
       the panel's earlier rows rotated to the end as zeros, which no pivot search picks);
    2. the factored panel and its ``t`` pivots reach every device in one ``psum``;
    3. every device applies the row interchanges to its columns (at most ``2 t`` rows move),
       and the owner stores the panel;
    4. every device solves its later columns' ``U`` row tile with ``L_kk`` and subtracts
       ``L[:, tile k] U[tile k, mine]`` from its window: one GEMM.
    """
    local, n = a.shape
    t = _inner(T_A, n, ndev)
    steps = n // t
    dtype = a.dtype
    tiles = jnp.asarray(_columns(ndev, local, t))[position][::t] // t  # each slot's tile

    def body(k0, k, carry):
        f, pivots, info = carry
        owner, slot, lo = k % ndev, k // ndev, k * t
        c0, s0 = k0 * t, k0 // ndev
        width = n - c0
        row = jnp.arange(width)[:, None]  # window row i is M's row c0 + i

        def factor(f):
            raw = lax.dynamic_slice(f, (slot * t, c0), (t, width)).T  # M[c0:, tile k]
            active = jnp.where(row < n - lo, jnp.roll(raw, c0 - lo, axis=0), 0)
            lu, piv, _ = unbatched(lax.linalg.lu, active)  # rows lo.. first
            zero = jnp.diagonal(lu[:t]) == 0
            failed = jnp.where(jnp.any(zero), lo + 1 + jnp.argmax(zero), 0)
            return lu, piv, failed.astype(jnp.int32)

        def skip(f):  # typed as factor's outputs: varying where f does
            zeros = jnp.zeros((width, t), dtype), jnp.zeros((t,), jnp.int32), jnp.int32(0)
            return dense._varying_like(zeros, f)

        lu, piv, failed = lax.cond(position == owner, factor, skip, f)
        info = jnp.where((info == 0) & (failed > 0), failed, info)
        lu, piv = lax.psum((lu, piv), axis)
        # the interchanges: row lo + j takes row lo + perm[j], which differs from j only
        # among the panel's rows and the rows they were swapped with
        perm = lax.linalg.lu_pivots_to_permutation(piv, width)
        moved = jnp.concatenate([jnp.arange(t, dtype=piv.dtype), piv])
        f = f.at[:, lo + moved].set(f[:, lo + perm[moved]])
        # the owner's panel, in its rows lo.. (its earlier rows hold U, from earlier steps)
        panel = jnp.roll(lu, lo - c0, axis=0)  # window row i: M's row c0 + i
        here = lax.dynamic_slice(f, (slot * t, c0), (t, width))
        stored = jnp.where(row.T >= lo - c0, panel.T, here)
        f = lax.dynamic_update_slice(f, jnp.where(position == owner, stored, here), (slot * t, c0))
        pivots = lax.dynamic_update_slice_in_dim(
            pivots,
            jnp.where(
                position == owner, lo + 1 + piv, lax.dynamic_slice_in_dim(pivots, slot * t, t)
            ),
            slot * t,
            0,
        )
        # U's row tile k at this device's later columns, and the trailing update
        later = jnp.repeat(tiles[s0:] > k, t)[:, None]  # [L - s0 t, 1]
        b = lax.dynamic_slice(f, (s0 * t, lo), (local - s0 * t, t))  # M[tile k, mine]^T
        u = unbatched(
            lax.linalg.triangular_solve,
            lu[:t],
            b,
            left_side=False,
            lower=True,
            transpose_a=True,
            unit_diagonal=True,
        )
        u = jnp.where(later, u, 0)
        below = jnp.where(row >= lo + t - c0, panel, 0)  # L[c0:, tile k], zero to row lo + t
        f = f.at[s0 * t :, c0:].add(-_mm(u, below.T))
        f = lax.dynamic_update_slice(f, jnp.where(later, u, b), (s0 * t, lo))
        return f, pivots, info

    carry = (a, *dense._varying_like((jnp.zeros((local,), jnp.int32), jnp.int32(0)), a))
    for k0, k1 in _buckets(steps, t, least=1):
        carry = lax.fori_loop(k0, k1, functools.partial(body, k0), carry)
    f, pivots, info = carry
    info = _first_failure(info, axis, n)
    f = jnp.where(info == 0, f, jnp.full_like(f, jnp.nan))
    return f, pivots, info.reshape(1)


def _global_pivots(pivots, position, axis, ndev, n, t):
    """LAPACK's ``ipiv`` ``[N]`` (0-based) on every device, from each device's own."""
    mine = jnp.asarray(_columns(ndev, pivots.shape[0], t))[position]
    return lax.psum(jnp.zeros((n,), pivots.dtype).at[mine].set(pivots), axis) - 1


def getrs(lu, pivots, b, position, *, axis, ndev, T_A, trans="N", **_):
    """Solve ``op(A) x = b`` with a factor of :func:`getrf`, of ``B = M Pi^T`` (``M``'s
    columns in the engine's order): ``(x, status)``. ``trans`` ``"N"``: ``L U y = P b``, ``x =
    Pi^T y``; ``"T"`` and ``"C"``: ``op(U) op(L) P x = Pi b``; each as two sweeps
    (:func:`_sweep`) over the distributed factor."""
    if trans not in ("N", "T", "C"):
        raise ValueError(f"trans must be 'N', 'T' or 'C', got {trans!r}")
    n = lu.shape[1]
    t = _inner(T_A, n, ndev)
    ipiv = _global_pivots(pivots, position, axis, ndev, n, t)
    perm = lax.linalg.lu_pivots_to_permutation(ipiv, n)  # (P B)[i] = B[perm[i]]
    natural, ordered = np.arange(n // t) * t, _order(n, ndev, T_A, t) * t
    sweep = functools.partial(_sweep, lu, position=position, axis=axis, ndev=ndev, t=t)
    rhs = b.T
    if trans == "N":
        y = sweep(rhs[perm], by_rows=True, lower=True, unit=True, at=(natural,) * 3)
        x = sweep(y, by_rows=True, lower=False, back=True, at=(natural, natural, ordered))
    else:
        conj = trans == "C"
        y = sweep(rhs, by_rows=False, lower=False, conj=conj, at=(natural, ordered, natural))
        y = sweep(y, by_rows=False, lower=True, unit=True, conj=conj, back=True, at=(natural,) * 3)
        x = jnp.zeros_like(y).at[perm].set(y, unique_indices=True)
    return x.T, jnp.zeros((1,), jnp.int32)


def potrs_factored(factor, b, position, *, axis, ndev, T_A, **_):
    """Solve with a factor of :func:`potrf`: ``(x, status)``."""
    x = _solve(factor, b.T, position, axis, ndev, T_A)
    return x.T, jnp.zeros((1,), jnp.int32)


def potrs(a, b, position, *, axis, ndev, T_A, **_):
    """Cholesky solve: ``(factor, x, status)`` as ``jaxmg_cuda.mg_potrs``."""
    f, status = potrf(a, position, axis=axis, ndev=ndev, T_A=T_A)
    x, _ = potrs_factored(f, b, position, axis=axis, ndev=ndev, T_A=T_A)
    return f, x, status


def syevd(a, position, *, vectors=True, axis, ndev, T_A, **_):
    """Hermitian eigensolver: ``(v, w, status)`` as ``jaxmg_cuda.mg_syevd``, by Householder
    tridiagonalisation (:mod:`jaxmg.engines.tridiagonal`)."""
    layout = _columns(ndev, a.shape[0], T_A)
    return tridiagonal.syevd(a, position, layout, vectors=vectors, axis=axis, ndev=ndev)


class CollectiveEngine(Engine):
    """Backend ``"jax"``: on a solver axis of several devices this engine, on one JAX's dense
    solvers (:mod:`jaxmg.engines.dense`)."""

    name = "jax"
    summary = "XLA's own collectives, several devices"
    platforms = None
    alone = dense.ENGINE

    def routines(self, platform, caller):
        return types.SimpleNamespace(
            potrs=potrs,
            potrf=potrf,
            potrs_factored=potrs_factored,
            potri=potri,
            potri_factored=potri_factored,
            getrf=getrf,
            getrs=getrs,
            syevd=syevd,
        )

    def tile(self, T_A, n, ndev, routine, platform, caller, pad):
        """The layout's tile: ``T_A`` (at most ``N / p``), which must divide ``N / p`` (the
        engine pads no tiles), or for ``None`` ``N / p``, JAX's own blocks, which need no
        relayout. The engine steps through tiles of its own inside it (:func:`_inner`)."""
        s = n // ndev
        if T_A is not None:
            if T_A < s and s % T_A:
                divisors = [t for t in range(1, s) if s % t == 0][-4:]
                raise ValueError(
                    f"{caller}: backend='jax' takes tiles that divide the {s} rows/columns each "
                    f"device holds (it pads none); T_A={T_A} does not. Use one of "
                    f"{', '.join(map(str, divisors))}, {s} or more, or None."
                )
            return min(T_A, s)
        return s

    def triangular_tile(self, n, ndev):
        """The engine's own tile: with it the engine's order is ``A``'s (:func:`_order`); with a
        wider one it factors a permutation of ``A``, whose factor is not triangular in ``A``'s
        order."""
        return _inner(n // ndev, n, ndev)

    def participants(self, mesh, axes, platform, caller):
        (axis,) = axes
        ndev = dict(mesh.shape)[axis]
        return ndev, (processes.UNKNOWN_DEVICE,) * ndev, 0, ()

    def job_attributes(self, geometry):
        return {"axis": geometry.axis, "ndev": geometry.ndev}


ENGINE = CollectiveEngine()
