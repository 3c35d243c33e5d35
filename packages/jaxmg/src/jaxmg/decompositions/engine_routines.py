"""Backend ``"mp"``'s own rectangular routines (``jaxmg_cuda.mp``).

On CPUs, ScaLAPACK's: ``p?gesvd`` for ``svd`` (``full_matrices=False``), ``polar`` and ``lstsq``;
``p?geqrf`` + ``p?orgqr`` (``p?ungqr``) for ``qr``, with JAX's rule on the first ``K`` columns for
its derivatives; ``p?gels`` as :func:`gels`. Each process's block of ``A`` goes to the engine as it
is (the 1D forms and a process grid ``P(r, c)``). On GPUs, cuSOLVERMp's Geqrf + Orgqr for ``qr`` and
Gels for :func:`gels` and ``least_squares`` (``M >= N``), on ``A`` relaid out in JAX into the
engine's tiles first (cuSOLVERMp has no p?gemr2d); ``svd``, ``polar`` and ``lstsq`` run the
compositions of :mod:`jaxmg.decompositions.svd` there. ``U``, ``Vh``, ``Q`` and ``R`` come back
sharded like ``A`` (whole where the device counts do not divide them, as :func:`_like_a` says): on
CPUs ScaLAPACK's p?gemr2d takes them from its tiles into JAX's blocks, on GPUs the engine returns
each process's local array of tiles and JAX relayouts it back (:func:`_from_tiles`). ``gels``'s
``x`` comes back whole on every process.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import jaxmg_layout

from ..describe import checks
from ..describe.checks import AnyMesh, Result, Specs
from ..describe.sharding import _placed
from ..engines.mp import targets
from .glue import (
    _REPLICATED,
    _engine_qr,
    _glue,
    _h,
    _like_a,
    _mm,
    _positive_diagonal,
    _qr_tangents,
    _where,
)


def _mp_tile(geometry, T_A, shape):
    """The engine's square tile: ``T_A``, else 64 or the smaller side of a block."""
    if T_A is not None:
        return int(T_A)
    rows, cols = geometry.blocks_grid
    return max(1, min(64, shape[0] // rows, shape[1] // cols))


def _tiles(geometry, block, tile):
    """This process's block of ``A`` (JAX's sharding, inside ``shard_map``) -> its local array
    in ``tile``-square tiles of the 2D block-cyclic layout over :attr:`Geometry.blocks_grid`
    (:meth:`jaxmg_layout.BlockCyclic2D.padded_local_block`): each sharded axis relaid out on its
    own; an axis of one process is in that layout already."""
    rows, cols = geometry.blocks_grid
    row_axis, col_axis = geometry.spec
    if cols > 1:
        block = jaxmg_layout.cyclic_1d_no_shardmap(block, tile, col_axis, axis=1)
    if rows > 1:
        block = jaxmg_layout.cyclic_1d_no_shardmap(block, tile, row_axis, axis=0)
    return block


def _from_tiles(geometry, local, tile, shape):
    """:func:`_tiles`'s inverse for a ``shape`` result: this process's local array of its
    ``tile``-square tiles, each extent rounded up to whole tiles (as the GPU engine returns it,
    :meth:`jaxmg_layout.BlockCyclic2D.padded_local_shape`) -> its block of JAX's sharding. A
    sharded axis needs ``tile`` at most its block; an axis of one process is cut to the
    result's extent."""
    rows, cols = geometry.blocks_grid
    row_axis, col_axis = geometry.spec
    r, c = shape
    if rows > 1:
        local = jaxmg_layout.undo_cyclic_1d_no_shardmap(local, tile, r, row_axis, axis=0)
    if cols > 1:
        local = jaxmg_layout.undo_cyclic_1d_no_shardmap(local, tile, c, col_axis, axis=1)
    return local[: r // rows, : c // cols]


def _mp_call(geometry, wrapper, tile, a, *replicated, shapes=()):
    """``wrapper`` (a ``jaxmg_cuda.mp`` rectangular target) on each process's part of ``a``
    (transposed: column-major) and the ``replicated`` operands; the status comes back as a
    scalar, last. On CPUs the part is JAX's block (ScaLAPACK relays it), on GPUs the local array
    of the engine's tiles (:func:`_tiles`).

    ``shapes``: the global shapes of the results before the status, ``None`` for one that is
    not a matrix. Given, the matrices come back sharded like ``A`` (the engine's ``blocks``,
    whose rule is :func:`_like_a`'s: whole where the grid does not divide one; on GPUs as local
    arrays of tiles, :func:`_from_tiles`); otherwise every result comes back whole and
    replicated."""
    m, n = a.shape
    kw = dict(m=m, n=n, grid=geometry.blocks_grid, T_A=tile)
    # the results the engine returns as blocks (its rule is _like_a's; a shape cannot tell: on
    # one process a square block is a whole matrix's shape), column-major as `a` goes in
    blocked = tuple(s is not None and _like_a(geometry, s) != _REPLICATED for s in shapes)
    gpu = geometry.platform == "gpu"
    if gpu:  # tiles no wider than a block of A or of a blocked result on a sharded axis: the
        # relayouts' layouts are then the engine's
        rows, cols = geometry.blocks_grid
        sides = [m // rows, n // cols]
        for shape, in_blocks in zip(shapes, blocked, strict=True):
            if in_blocks:
                r, c = shape
                sides += ([r // rows] if rows > 1 else []) + ([c // cols] if cols > 1 else [])
        tile = kw["T_A"] = min(tile, *sides)
        kw["nccl_id"] = targets().nccl_id()
    specs = tuple(P() if s is None else _like_a(geometry, s) for s in shapes)
    if shapes:
        kw["blocks"] = True

    def back(x, i):
        if not (i < len(blocked) and blocked[i]):
            return x
        return _from_tiles(geometry, x.T, tile, shapes[i]) if gpu else x.T

    def body(block, *rest):
        if gpu:
            block = _tiles(geometry, block, tile)
        out = wrapper(block.T, *rest, geometry.position(), **kw)
        return tuple(back(x, i) for i, x in enumerate(out))

    out = jax.shard_map(
        body,
        mesh=geometry.mesh,
        in_specs=(geometry.spec,) + (_REPLICATED,) * len(replicated),
        out_specs=specs + (P(),) if shapes else P(),
        check_vma=False,
    )(a, *replicated)
    return (*out[:-1], out[-1][0])


def _svd_native(geometry, T_A, a):
    """``(U, s, Vh, status)`` of any ``[M, N]`` ``a`` by p?gesvd, ``U`` and ``Vh`` like ``A``."""
    m, n = a.shape
    k = min(m, n)
    tile = _mp_tile(geometry, T_A, a.shape)
    shapes = ((m, k), None, (k, n))
    return _mp_call(geometry, targets().gesvd, tile, a, shapes=shapes)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _qr_native(geometry, T_A, a):
    """``(Q, R, status)`` of any ``[M, N]`` ``a`` by p?geqrf and p?orgqr (p?ungqr)."""
    m, n = a.shape
    k = min(m, n)
    tile = _mp_tile(geometry, T_A, a.shape)
    q, r, status = _mp_call(geometry, targets().qr, tile, a, shapes=((m, k), (k, n)))
    specs = (_like_a(geometry, q.shape), _like_a(geometry, r.shape))
    q, r = _glue(geometry, specs, _positive_diagonal, q, r)
    return q, r, status


@_qr_native.defjvp
def _qr_native_jvp(geometry, T_A, primals, tangents):
    """:func:`_qr_jvp`'s rule on the first ``K`` columns, ``A_1 = Q R_1`` (``R_1`` replicated
    and small: ``dA_1 R_1^{-1}`` by a triangular solve); for ``M < N`` the rest of ``R``,
    ``R_2 = Q^H A_2``, by the product rule."""
    (a,), (da,) = primals, tangents
    q, r, status = _qr_native(geometry, T_A, a)
    m, n = a.shape
    k = min(m, n)

    def rule(q, r, a, da):
        r1 = r[:, :k]
        da_rinv = jax.scipy.linalg.solve_triangular(r1, da[:, :k].T, trans="T", lower=False).T
        dq, dr = _qr_tangents(q, r1, da_rinv)
        if n > m:
            dr = jnp.concatenate([dr, _mm(_h(dq), a[:, m:]) + _mm(_h(q), da[:, m:])], axis=1)
        return dq, dr

    specs = (_like_a(geometry, q.shape), _like_a(geometry, r.shape))
    dq, dr = _glue(geometry, specs, rule, q, r, a, da)
    return (q, r, status), (dq, dr, np.zeros(status.shape, jax.dtypes.float0))


def gels(
    A: jax.Array,
    b: jax.Array,
    mesh: AnyMesh | None = None,
    in_specs: Specs | None = None,
    *positional: Any,
    T_A: int | None = None,
    return_status: bool = False,
) -> Result:
    """The engine's least squares on a sharded ``[M, N]`` ``A`` of full rank (backend ``"mp"``:
    ScaLAPACK's p?gels on CPUs, cuSOLVERMp's Gels on GPUs): the least-squares solution of ``A x
    = b`` for ``M >= N``, the minimum-norm one for ``M < N`` (CPUs only), through a QR (``M >=
    N``) or LQ factorisation.

    Args:
      A: as for :func:`svd`, also over a process grid ``P(r, c)`` (``M`` divisible by ``r``,
        ``N`` by ``c``).
      b: ``[M]`` or ``[M, K]``, ``A``'s dtype (replicated for the solve).
      T_A: the engine's square tile (default: 64, or the smaller side of a block).
      return_status: also return the status: 0, or ``k > 0`` when the ``k``-th diagonal entry
        of the triangular factor is exactly zero (``x`` is then NaN). A nearly rank-deficient
        ``A`` is not detected: its ``x`` is large and inaccurate; use :func:`lstsq`, which
        drops the small singular values.

    Returns ``x`` (``[N]`` or ``[N, K]``, replicated), and the status. No derivatives.
    """
    caller = "jaxmg.gels"
    checks.keyword_only(caller, positional, "T_A or return_status, e.g. return_status=True")
    geometry, dtype = _where(A, mesh, in_specs, "mp", caller, _engine_qr)
    m, n = A.shape
    if geometry.platform == "gpu" and m < n:
        raise ValueError(
            f"{caller}: A has shape {(m, n)}; cuSOLVERMp's Gels runs here for M >= N (least "
            "squares). For the minimum-norm solution of a wide A call jaxmg.lstsq."
        )
    b_shape = checks.rhs_shape(b, m, dtype, caller)
    T_A = checks.tile_size(T_A, caller)
    a = _placed(A, geometry.mesh, geometry.spec)
    b2 = _placed(jnp.reshape(b, (m, -1)), geometry.mesh, _REPLICATED)
    x, status = _gels_call(geometry, _mp_tile(geometry, T_A, (m, n)), a, b2)
    x = x[:, 0] if len(b_shape) == 1 else x
    return (x, status) if return_status else x


@functools.partial(jax.jit, static_argnums=(0, 1))
def _gels_call(geometry, tile, a, b):
    return _mp_call(geometry, targets().gels, tile, a, b)
