"""Backend ``"jax"`` on several devices: Cholesky and its solves made of XLA's own collectives.

Every cross-device step is a ``lax.psum`` over the solver's mesh axis inside the program's
``jax.shard_map``; there is no native target, so the engine runs wherever JAX runs (any
platform, one process or one per device), fuses with the caller's program, and ``jax.vmap`` and
derivatives come from JAX.

The operand contract is the native engines' (packages/jaxmg-cuda/README.md): each device holds
``a`` ``[L, N]``, the column-major storage of its column tiles of the matrix ``M`` the solver
sees, global tile ``k`` (columns ``k t .. (k + 1) t``) on device ``k mod p`` at local slot
``k // p``. The engine takes tiles ``t`` that divide ``N / p`` (:meth:`CollectiveEngine.tile`),
so there is no padding: ``L = N / p``, and the ``K = N / t`` tiles are all whole.

Cholesky (:func:`potrf`): right-looking, one tile of columns at a time, in a ``lax.fori_loop``
per bucket of steps (:func:`_buckets`): a bucket's steps share the static shapes of its first
step's trailing matrix, so the flops stay within ``1 / SHRINK^2`` of ``N^3 / (3 p)`` per device
while the program holds one loop body per bucket, not one per tile. Step ``k``: the owner of tile
``k`` factors its diagonal block and solves the tile below it, the result reaches every device in
one ``psum``, and each device updates its own later tiles with a few GEMMs (:func:`_chunks`, the
staircase of the lower triangle). ``info`` is LAPACK's: the order of the first leading minor that
is not positive definite, found inside the failing diagonal block
(:func:`jaxmg.engines.dense._cholesky`); the factor is then NaN.

Solves (:func:`potrs_factored`): ``L y = b`` by tiles, each tile's ``y`` from the sum over
every device's earlier columns (one ``psum`` of ``t x nrhs`` and the diagonal block), then
``L^H x = y`` backwards, each tile's ``x`` from its owner's column (one ``psum``). ``b`` and
``x`` are the same on every device.

Not on this engine yet (each raises at trace time, saying so): the inverse (``potri``, and the
derivative of a log-determinant, which needs it), LU (``getrf``/``getrs``) and the eigensolver
(``syevd``).
"""

from __future__ import annotations

import functools
import math
import types

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..describe import processes
from . import dense
from .base import Engine

_HIGHEST = lax.Precision.HIGHEST

#: The widest tile the engine chooses by itself, and the most tiles (steps) it aims at.
DEFAULT_TILE = 256
MAX_TILES = 64
#: How far a bucket's trailing order falls before the next bucket (:func:`_buckets`), and the
#: most GEMMs a step's trailing update takes (:func:`_chunks`).
SHRINK = 0.9
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


def _buckets(steps: int) -> list[tuple[int, int]]:
    """The steps ``[k0, k1)`` that share one loop body, with the static shapes of step ``k0``'s
    trailing matrix: a bucket ends once the trailing order has fallen to :data:`SHRINK` of its
    start's, so that a step does at most ``1 / SHRINK^2`` its own flops."""
    out, k0 = [], 0
    while k0 < steps:
        k1 = min(steps, max(k0 + 1, math.ceil(steps - SHRINK * (steps - k0))))
        out.append((k0, k1))
        k0 = k1
    return out


def _chunks(first: int, slots: int) -> list[tuple[int, int]]:
    """The local slots ``[first, slots)`` in at most :data:`CHUNKS` runs: each run is one GEMM
    whose columns start at its first slot's (the staircase of the lower triangle)."""
    bounds = np.linspace(first, slots, min(CHUNKS, slots - first) + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]


def potrf(a, position, *, axis, ndev, T_A, **_):
    """The Cholesky factor, distributed: ``(factor, status)`` as ``jaxmg_cuda.mg_potrf``.

    A ``lax.fori_loop`` per bucket of steps (:func:`_buckets`); step ``k`` of a bucket
    starting at ``k0``, whose trailing window is the columns from ``c0 = k0 t`` and this
    device's slots from ``k0 // p``:

    1. the owner of tile ``k`` factors its diagonal block and solves the tile below it (under
       ``lax.cond``: the other devices skip it) into ``X = M[c0:, tile k] L_kk^-H``, zero above
       row ``k t + t``;
    2. ``X`` reaches every device in one ``psum``, and the owner stores its column;
    3. every device subtracts ``conj(X[my columns]) X^T`` from its window, in :func:`_chunks`
       (the zero rows of ``X`` leave every finished or current column as it is).
    """
    t, (local, n) = T_A, a.shape
    steps, slots = n // t, local // t
    dtype = a.dtype

    def body(k0, k, carry):
        f, info = carry
        owner, slot, lo = k % ndev, k // ndev, k * t
        c0, s0 = k0 * t, k0 // ndev
        width = n - c0
        rows = jnp.arange(width)[:, None] + c0  # X's global rows

        def factor(f):
            raw = lax.dynamic_slice(f, (slot * t, c0), (t, width)).T  # M[c0:, tile k]
            diagonal, failed = dense._cholesky(lax.dynamic_slice(raw, (lo - c0, 0), (t, t)))
            x = lax.linalg.triangular_solve(
                diagonal, raw, left_side=False, lower=True, transpose_a=True, conjugate_a=True
            )
            x = jnp.where(rows >= lo + t, x, 0)
            column = lax.dynamic_update_slice(x, diagonal, (lo - c0, 0)).T
            return x, column, jnp.where(failed > 0, lo + failed, 0).astype(jnp.int32)

        def skip(f):
            zero = jnp.zeros((width, t), dtype)
            return zero, zero.T, jnp.int32(0)

        x, column, failed = lax.cond(position == owner, factor, skip, f)
        info = jnp.where((info == 0) & (failed > 0), failed, info)
        x = lax.psum(x, axis)
        here = lax.dynamic_slice(f, (slot * t, c0), (t, width))
        f = lax.dynamic_update_slice(f, jnp.where(position == owner, column, here), (slot * t, c0))
        # X at this device's columns: its slots s >= s0 hold tiles s p + position
        padded = jnp.concatenate([jnp.zeros((c0 - s0 * ndev * t, t), dtype), x])
        padded = padded.reshape(slots - s0, ndev, t, t)
        mine = lax.dynamic_index_in_dim(padded, position, 1, keepdims=False)
        mine = jnp.conj(mine.reshape((slots - s0) * t, t))
        for first, last in _chunks(s0, slots):
            start = max(c0, first * ndev * t)
            left = mine[(first - s0) * t : (last - s0) * t]
            update = _mm(left, x[start - c0 :].T)
            f = f.at[first * t : last * t, start:].add(-update)
        return f, info

    carry = (a, jnp.int32(0))
    for k0, k1 in _buckets(steps):
        carry = lax.fori_loop(k0, k1, functools.partial(body, k0), carry)
    f, info = carry
    # LAPACK's info is the first failure: each device knows those of its own tiles
    never = jnp.int32(n + 1)
    info = lax.pmin(jnp.where(info > 0, info, never), axis)
    info = jnp.where(info == never, 0, info)
    # the factor is lower: zero what the loop left of the upper triangle (columns before the
    # bucket that factored each tile)
    column_of_row = jnp.asarray(_columns(ndev, local, t))[position][:, None]
    upper = jnp.arange(n)[None, :] < column_of_row - column_of_row % t
    f = jnp.where(info == 0, jnp.where(upper, 0, f), jnp.full_like(f, jnp.nan))
    return f, info.reshape(1)


def _solve(f, rhs, position, axis, ndev, t):
    """``(L L^H)^-1 rhs`` for the distributed factor ``f`` (``rhs`` ``[N, k]``, replicated): a
    ``lax.fori_loop`` over the tiles each way, one ``psum`` of ``t x (k + t)`` per tile."""
    local, n = f.shape
    k_rhs = rhs.shape[1]

    def forward(k, carry):  # L y = rhs
        y, mine = carry  # mine: y at this device's columns, zero until solved
        owner, slot, lo = k % ndev, k // ndev, k * t
        partial = _mm(lax.dynamic_slice_in_dim(f, lo, t, axis=1).T, mine)  # L[tile k, mine] y
        own = lax.dynamic_slice(f, (slot * t, lo), (t, t)).T  # L_kk on its owner
        summed = lax.psum(jnp.concatenate([partial, _owned(position, owner, own)], 1), axis)
        partial, diagonal = summed[:, :k_rhs], summed[:, k_rhs:]
        y_k = lax.linalg.triangular_solve(
            diagonal, lax.dynamic_slice_in_dim(rhs, lo, t) - partial, left_side=True, lower=True
        )
        y = lax.dynamic_update_slice_in_dim(y, y_k, lo, 0)
        here = lax.dynamic_slice_in_dim(mine, slot * t, t)
        mine = lax.dynamic_update_slice_in_dim(
            mine, jnp.where(position == owner, y_k, here), slot * t, 0
        )
        return y, mine

    def backward(i, x):  # L^H x = y
        k = n // t - 1 - i
        owner, slot, lo = k % ndev, k // ndev, k * t
        column = lax.dynamic_slice_in_dim(f, slot * t, t)  # L[:, tile k]^T on its owner
        later = _mm(jnp.conj(column), x)  # x is zero from row lo + t down... up, until solved
        diagonal = lax.dynamic_slice_in_dim(column, lo, t, axis=1).T
        summed = lax.psum(_owned(position, owner, jnp.concatenate([later, diagonal], 1)), axis)
        later, diagonal = summed[:, :k_rhs], summed[:, k_rhs:]
        x_k = lax.linalg.triangular_solve(
            diagonal,
            lax.dynamic_slice_in_dim(y, lo, t) - later,
            left_side=True,
            lower=True,
            transpose_a=True,
            conjugate_a=True,
        )
        return lax.dynamic_update_slice_in_dim(x, x_k, lo, 0)

    zeros = jnp.zeros_like(rhs)
    y, _ = lax.fori_loop(0, n // t, forward, (zeros, jnp.zeros((local, k_rhs), rhs.dtype)))
    return lax.fori_loop(0, n // t, backward, zeros)


def potrs_factored(factor, b, position, *, axis, ndev, T_A, **_):
    """Solve with a factor of :func:`potrf`: ``(x, status)``."""
    x = _solve(factor, b.T, position, axis, ndev, T_A)
    return x.T, jnp.zeros((1,), jnp.int32)


def potrs(a, b, position, *, axis, ndev, T_A, **_):
    """Cholesky solve: ``(factor, x, status)`` as ``jaxmg_cuda.mg_potrs``."""
    f, status = potrf(a, position, axis=axis, ndev=ndev, T_A=T_A)
    x, _ = potrs_factored(f, b, position, axis=axis, ndev=ndev, T_A=T_A)
    return f, x, status


def _refuse(what: str, caller: str):
    def refuse(*args, **kwargs):
        raise NotImplementedError(
            f"{caller}: backend='jax' on several devices has no {what} yet (its Cholesky "
            "factorisation and solves run: potrs, cho_factor/cho_solve, the log-determinant). "
            "backend='mg' (cuSolverMg, or its LAPACK twin on CPUs) has it on one node."
        )

    return refuse


class CollectiveEngine(Engine):
    """Backend ``"jax"``: on a solver axis of several devices this engine, on one JAX's dense
    solvers (:mod:`jaxmg.engines.dense`)."""

    name = "jax"
    summary = "XLA's own collectives, several devices"
    platforms = None
    alone = dense.ENGINE

    def routines(self, platform, caller):
        inverse = _refuse("inverse (potri, and the derivative of a log-determinant)", caller)
        lu = _refuse("LU factorisation (lu_factor, lu_solve)", caller)
        return types.SimpleNamespace(
            potrs=potrs,
            potrf=potrf,
            potrs_factored=potrs_factored,
            potri=inverse,
            potri_factored=inverse,
            getrf=lu,
            getrs=lu,
            syevd=_refuse("eigensolver (syevd, and svd, polar, lstsq through it)", caller),
        )

    def tile(self, T_A, n, ndev, routine, platform, caller, pad):
        """``T_A`` (at most ``N / p``), which must divide ``N / p``: the engine pads no tiles.
        For ``None`` the widest tile dividing ``N / p`` up to :data:`DEFAULT_TILE`, or wider
        where ``N`` would take more than :data:`MAX_TILES` tiles."""
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
        cap = max(DEFAULT_TILE, -(-n // MAX_TILES))
        return max(t for t in range(1, min(cap, s) + 1) if s % t == 0)

    def participants(self, mesh, axes, platform, caller):
        (axis,) = axes
        ndev = dict(mesh.shape)[axis]
        return ndev, (processes.UNKNOWN_DEVICE,) * ndev, 0, ()

    def job_attributes(self, geometry):
        return {"axis": geometry.axis, "ndev": geometry.ndev}


ENGINE = CollectiveEngine()
