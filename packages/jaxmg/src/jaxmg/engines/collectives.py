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

Cholesky (:func:`potrf`): right-looking, one tile of columns at a time, unrolled (every slice
static, so the trailing update of step ``k`` touches only rows and columns past the tile: the
flops stay those of ``N^3 / (3 p)`` per device, plus at most one tile of rows per step). Step
``k``: the owner's tile (rows ``k t ..`` only) reaches every device in one ``psum``; each device
factors the diagonal block and solves the tile below it (the same small work on every device,
which would otherwise wait for the owner), the owner stores it, and each device updates its own
later tiles with one GEMM. ``info`` is LAPACK's: the order of the first leading minor that is not
positive definite, found inside the failing diagonal block
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
import types

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..describe import processes
from . import dense
from .base import Engine

_HIGHEST = lax.Precision.HIGHEST

#: The widest tile the engine chooses by itself, and the most tiles (unrolled steps) it aims at.
DEFAULT_TILE = 256
MAX_TILES = 64


def _mm(x, y):
    return jnp.matmul(x, y, precision=_HIGHEST)


@functools.lru_cache(maxsize=64)
def _columns(ndev: int, local: int, tile: int) -> np.ndarray:
    """``[ndev, local]``: the global column of each device's local column (tile ``k`` on device
    ``k mod ndev``, slot ``k // ndev``)."""
    devices = np.arange(ndev)[:, None]
    r = np.arange(local)[None, :]
    return (devices + (r // tile) * ndev) * tile + r % tile


def _mine(position, ndev, local, tile):
    """This device's global columns, one per local column."""
    return jnp.asarray(_columns(ndev, local, tile))[position]


def _owned(position, owner, x):
    """``x`` on the owner, zeros elsewhere: summed over the axis, the owner's ``x`` everywhere."""
    return jnp.where(position == owner, x, jnp.zeros_like(x))


def potrf(a, position, *, axis, ndev, T_A, **_):
    """The Cholesky factor, distributed: ``(factor, status)`` as ``jaxmg_cuda.mg_potrf``."""
    t, (local, n) = T_A, a.shape
    steps = n // t
    mine = _mine(position, ndev, local, t)
    f, info = a, jnp.int32(0)
    for k in range(steps):
        owner, slot, lo = k % ndev, k // ndev, k * t
        rows = slice(slot * t, (slot + 1) * t)
        # M[lo:, tile k]^T, from its owner
        panel = lax.psum(_owned(position, owner, f[rows, lo:]), axis)
        diagonal, failed_at = dense._cholesky(panel[:, :t].T)
        info = jnp.where((info == 0) & (failed_at > 0), lo + failed_at, info)
        parts = [diagonal.T]
        if k + 1 < steps:  # no empty arrays: Shardy refuses them in transposed programs
            below = lax.linalg.triangular_solve(
                diagonal,
                panel[:, t:].T,
                left_side=False,
                lower=True,
                transpose_a=True,
                conjugate_a=True,
            )  # M[lo + t:, tile k] L_kk^-H
            parts.append(below.T)
        if lo:
            parts.insert(0, jnp.zeros((t, lo), f.dtype))
        column = jnp.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
        f = f.at[rows].set(jnp.where(position == owner, column, f[rows]))
        if k + 1 == steps:
            break
        # M[i, g] -= L[i, tile k] L[g, tile k]^H for every later column g of this device
        first = slot * t  # local rows of tiles before slot `slot` are all earlier than k
        g = mine[first:]
        later = g >= lo + t
        l_g = jnp.take(below, jnp.clip(g - (lo + t), 0, n - lo - t - 1), axis=0)
        update = _mm(jnp.conj(l_g), below.T)
        f = f.at[first:, lo + t :].add(-jnp.where(later[:, None], update, 0))
    f = dense._nan_unless(info == 0, f)
    return f, info.reshape(1)


def _solve(f, rhs, position, axis, ndev, t):
    """``(L L^H)^-1 rhs`` for the distributed factor ``f`` (``rhs`` ``[N, k]``, replicated)."""
    local, n = f.shape
    mine = _mine(position, ndev, local, t)
    y = jnp.zeros_like(rhs)
    for k in range(n // t):  # L y = rhs
        owner, slot, lo = k % ndev, k // ndev, k * t
        known = (slot + 1) * t  # local rows that may hold columns before tile k
        g = mine[:known]
        y_g = jnp.where((g < lo)[:, None], jnp.take(y, jnp.minimum(g, n - 1), axis=0), 0)
        # the sum over my columns g < lo of L[tile k, g] y[g]
        partial = _mm(f[:known, lo : lo + t].T, y_g)
        own = _owned(position, owner, f[slot * t : known, lo : lo + t])  # L_kk^T
        summed = lax.psum(jnp.concatenate([partial, own.T], axis=1), axis)
        partial, diagonal = summed[:, : rhs.shape[1]], summed[:, rhs.shape[1] :]
        y_k = lax.linalg.triangular_solve(
            diagonal, rhs[lo : lo + t] - partial, left_side=True, lower=True
        )
        y = y.at[lo : lo + t].set(y_k)
    x = jnp.zeros_like(rhs)
    for k in reversed(range(n // t)):  # L^H x = y
        owner, slot, lo = k % ndev, k // ndev, k * t
        column = f[slot * t : (slot + 1) * t]  # L[:, tile k]^T on its owner
        if lo + t < n:
            later = _mm(jnp.conj(column[:, lo + t :]), x[lo + t :])
        else:
            later = jnp.zeros((t, rhs.shape[1]), rhs.dtype)
        summed = lax.psum(
            _owned(position, owner, jnp.concatenate([later, column[:, lo : lo + t].T], 1)), axis
        )
        later, diagonal = summed[:, : rhs.shape[1]], summed[:, rhs.shape[1] :]
        x_k = lax.linalg.triangular_solve(
            diagonal,
            y[lo : lo + t] - later,
            left_side=True,
            lower=True,
            transpose_a=True,
            conjugate_a=True,
        )
        x = x.at[lo : lo + t].set(x_k)
    return x


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
