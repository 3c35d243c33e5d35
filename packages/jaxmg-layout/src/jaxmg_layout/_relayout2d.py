"""Block sharding ``P(r, c)`` <-> the 2D block-cyclic layout of ScaLAPACK and cuSOLVERMp.

The 2D layout is the 1D one twice: block column ``J`` goes to process column ``J % cols`` at
local block column ``J // cols`` whatever the row, and block rows likewise over the process
rows. So the relayout is the 1D relayout (:func:`jaxmg_layout.cyclic_1d_no_shardmap`) along
the columns, over the mesh axis of the process columns, then along the rows, over the axis of
the process rows, with one square tile for both (:meth:`BlockCyclic2D.for_blocks`). Each step
moves data only within one process row (or column) and only what changes owner: where the
tile is as wide as a shard along an axis, nothing moves along it.
"""

from __future__ import annotations

import functools

import jax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

from ._plan2d import BlockCyclic2D
from ._relayout import _sharding_of, cyclic_1d_no_shardmap, undo_cyclic_1d_no_shardmap

__all__ = [
    "cyclic_2d_layout",
    "cyclic_2d_no_shardmap",
    "undo_cyclic_2d_layout",
    "undo_cyclic_2d_no_shardmap",
]


def _grid_names(axis_names, caller: str) -> tuple[str, str]:
    if not isinstance(axis_names, (tuple, list)) or len(axis_names) != 2:
        raise TypeError(
            f"{caller}: axis_names must be the (rows, cols) pair of mesh axes of P(r, c), got "
            f"{axis_names!r}."
        )
    return axis_names[0], axis_names[1]


def cyclic_2d_no_shardmap(x, T_A: int, axis_names: tuple[str, str]):
    """Relayout a local block, inside ``shard_map``, to the 2D block-cyclic layout.

    Args:
        x: this process's block ``[N / rows, N / cols]`` of an ``N x N`` matrix sharded
            ``P(r, c)`` over the mesh axes ``axis_names = (r, c)``.
        T_A: the requested tile; the square tile used is ``min(T_A, N / rows, N / cols)``.
        axis_names: the mesh axes of the process rows and columns.

    Returns:
        The local array ``[Lr, Lc]`` (:attr:`BlockCyclic2D.padded_local_shape`), row-major:
        the rows and columns :meth:`BlockCyclic2D.row_map` / ``col_map`` name, in that order,
        then zeros.
    """
    r, c = _grid_names(axis_names, "cyclic_2d_no_shardmap")
    rows, cols = lax.axis_size(r), lax.axis_size(c)
    n = x.shape[1] * cols
    if x.ndim != 2 or x.shape[0] * rows != n:
        raise ValueError(
            f"cyclic_2d_no_shardmap: a block of shape {tuple(x.shape)} on a {rows} x {cols} grid "
            "is not one of a square matrix."
        )
    tile = BlockCyclic2D.for_blocks(n, (rows, cols), T_A).tile
    x = cyclic_1d_no_shardmap(x, tile, c, axis=1)
    return cyclic_1d_no_shardmap(x, tile, r, axis=0)


def undo_cyclic_2d_no_shardmap(x_bc, T_A: int, N: int, axis_names: tuple[str, str]):
    """Inverse of :func:`cyclic_2d_no_shardmap`: the local array ``[Lr, Lc]`` back to this
    process's block ``[N / rows, N / cols]`` of the ``P(r, c)`` sharding."""
    r, c = _grid_names(axis_names, "undo_cyclic_2d_no_shardmap")
    plan = BlockCyclic2D.for_blocks(N, (lax.axis_size(r), lax.axis_size(c)), T_A)
    if tuple(x_bc.shape) != plan.padded_local_shape:
        raise ValueError(
            f"undo_cyclic_2d_no_shardmap: for N={N}, T_A={T_A} on a {plan.rows} x {plan.cols} "
            f"grid the local array has shape {plan.padded_local_shape}, got {tuple(x_bc.shape)}."
        )
    x = undo_cyclic_1d_no_shardmap(x_bc, plan.tile, N, r, axis=0)
    return undo_cyclic_1d_no_shardmap(x, plan.tile, N, c, axis=1)


def _grid_axes(sharding, caller: str) -> tuple[str, str]:
    spec = tuple(sharding.spec) + (None,) * (2 - len(sharding.spec))
    if len(spec) != 2 or not all(isinstance(entry, str) for entry in spec) or spec[0] == spec[1]:
        raise ValueError(
            f"{caller}: the matrix must be sharded over two mesh axes, P(r, c), one for the "
            f"process rows and one for the process columns; got {sharding.spec}."
        )
    return spec[0], spec[1]


@functools.partial(jax.jit, static_argnames=("T_A", "N", "mesh", "spec", "undo"))
def _global(a, *, T_A, N, mesh, spec, undo):
    def local(x):
        if undo:
            return undo_cyclic_2d_no_shardmap(x, T_A, N, tuple(spec))
        return cyclic_2d_no_shardmap(x, T_A, tuple(spec))

    return jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False)(a)


def cyclic_2d_layout(a, T_A: int, *, sharding: NamedSharding | None = None):
    """Relayout an ``N x N`` matrix sharded ``P(r, c)`` to the 2D block-cyclic layout.

    Args:
        a: square ``jax.Array`` sharded over two mesh axes, ``P(r, c)`` (process rows over
            ``r``, columns over ``c``).
        T_A: the requested tile (see :meth:`BlockCyclic2D.for_blocks`).
        sharding: only needed under ``jax.jit`` on a mesh with Auto axes.

    Returns:
        An ``rows*Lr x cols*Lc`` array sharded like ``a``: process ``(i, j)`` holds its local
        array of the layout (:func:`cyclic_2d_no_shardmap`).

    Raises:
        ValueError: a non-square ``a``, a sharding that is not ``P(r, c)``, or ``N`` not
            divisible by the grid.
    """
    sharding = _sharding_of(a, sharding, "cyclic_2d_layout")
    spec = _grid_axes(sharding, "cyclic_2d_layout")
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"cyclic_2d_layout: a must be a square matrix, got shape {a.shape}.")
    grid = (sharding.mesh.shape[spec[0]], sharding.mesh.shape[spec[1]])
    BlockCyclic2D.for_blocks(a.shape[0], grid, T_A)  # validates before any device work
    return _global(a, T_A=int(T_A), N=a.shape[0], mesh=sharding.mesh, spec=P(*spec), undo=False)


def undo_cyclic_2d_layout(a_bc, T_A: int, N: int, *, sharding: NamedSharding | None = None):
    """Inverse of :func:`cyclic_2d_layout`: the ``N x N`` matrix sharded ``P(r, c)`` again."""
    sharding = _sharding_of(a_bc, sharding, "undo_cyclic_2d_layout")
    spec = _grid_axes(sharding, "undo_cyclic_2d_layout")
    grid = (sharding.mesh.shape[spec[0]], sharding.mesh.shape[spec[1]])
    plan = BlockCyclic2D.for_blocks(N, grid, T_A)
    expected = (grid[0] * plan.padded_local_shape[0], grid[1] * plan.padded_local_shape[1])
    if a_bc.ndim != 2 or tuple(a_bc.shape) != expected:
        raise ValueError(
            f"undo_cyclic_2d_layout: for N={N}, T_A={T_A} on a {grid[0]} x {grid[1]} grid the "
            f"block-cyclic array has shape {expected}, got {tuple(a_bc.shape)}."
        )
    return _global(a_bc, T_A=int(T_A), N=int(N), mesh=sharding.mesh, spec=P(*spec), undo=True)
