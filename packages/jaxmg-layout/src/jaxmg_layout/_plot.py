"""A picture of the block -> block-cyclic mapping (needs the ``plot`` extra: matplotlib)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._plan import CyclicPlan
from ._plan2d import BlockCyclic2D

__all__ = ["plot_layout", "plot_layout_2d"]


def plot_layout(N: int, ndev: int, T_A: int, *, figsize: tuple[float, float] | None = None) -> Any:
    """Draw where every column of an ``N x N`` matrix goes in the block-cyclic layout.

    Top: JAX's block sharding, each column coloured by the device holding it. Bottom: every
    device's local block-cyclic columns, coloured by the device that held them before, tile
    boundaries marked and padding hatched in grey.

    Returns:
        The ``matplotlib.figure.Figure``.
    """
    try:
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap
        from matplotlib.patches import Patch
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("plot_layout needs matplotlib: pip install 'jaxmg-layout[plot]'") from err

    plan = CyclicPlan.make(N, ndev, T_A)
    colours = ListedColormap(plt.get_cmap("tab10" if ndev <= 10 else "tab20").colors[:ndev])
    source = np.arange(N) // plan.shard_size  # device of each column in block sharding
    cmap = plan.column_map()  # [ndev, L] global column or -1
    cyclic = np.where(cmap >= 0, source[np.maximum(cmap, 0)], -1)

    fig, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=figsize or (10, 2.2 + 0.45 * ndev),
        height_ratios=[1, ndev],
        layout="constrained",
    )
    top.imshow(
        source[None, :], aspect="auto", cmap=colours, vmin=0, vmax=ndev - 1, interpolation="nearest"
    )
    top.set_title(f"block sharding: N={N}, {ndev} devices, {plan.shard_size} columns each")
    top.set_yticks([])
    top.set_xlabel("global column")
    for k in range(1, plan.num_tiles):
        top.axvline(k * plan.tile - 0.5, color="white", lw=0.5)

    masked = np.ma.masked_less(cyclic, 0)
    bottom.set_facecolor("0.85")
    bottom.imshow(
        masked, aspect="auto", cmap=colours, vmin=0, vmax=ndev - 1, interpolation="nearest"
    )
    for d in range(ndev):
        for c in np.flatnonzero(cmap[d] < 0):
            bottom.add_patch(
                plt.Rectangle(
                    (c - 0.5, d - 0.5), 1, 1, fill=False, hatch="///", edgecolor="0.5", lw=0
                )
            )
    for m in range(1, plan.tiles_per_device):
        bottom.axvline(m * plan.tile - 0.5, color="white", lw=1)
    if plan.num_tiles <= 64:
        for k in range(plan.num_tiles):
            d, m = k % ndev, k // ndev
            bottom.text(
                m * plan.tile + (plan.tile - 1) / 2,
                d,
                f"{k}",
                ha="center",
                va="center",
                fontsize=7,
                color="white",
            )
    bottom.set_yticks(range(ndev), [f"device {d}" for d in range(ndev)])
    bottom.set_xlabel("local column (numbers: global tile)")
    bottom.set_title(
        f"1D block-cyclic, T_A={T_A} (tile {plan.tile}): local width {plan.local_width}, "
        f"{ndev * plan.local_width - N} zero columns in all"
    )
    handles = [Patch(color=colours(d), label=f"from device {d}") for d in range(ndev)]
    handles.append(Patch(facecolor="0.85", hatch="///", edgecolor="0.5", label="padding"))
    bottom.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return fig


def plot_layout_2d(N: int, grid: tuple[int, int], T_A: int, *, figsize=None):
    """Draw where every element of an ``N x N`` matrix sharded ``P(r, c)`` goes in the 2D
    block-cyclic layout (:func:`jaxmg_layout.cyclic_2d_layout`).

    Left: JAX's block sharding, each element coloured by the process ``(i, j)`` holding it.
    Right: every process's local array of the layout, placed at its grid position and coloured
    by the process that held each element before; tile boundaries in thin lines, process
    boundaries in thick ones, padding grey. Tiles carry their global ``(block row, block
    column)`` when there are at most 16 of each.

    Returns:
        The ``matplotlib.figure.Figure``.
    """
    try:
        import matplotlib.pyplot as plt
        from matplotlib.colors import ListedColormap
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "plot_layout_2d needs matplotlib: pip install 'jaxmg-layout[plot]'"
        ) from err

    plan = BlockCyclic2D.for_blocks(N, grid, T_A)
    rows, cols, t = plan.rows, plan.cols, plan.tile
    (sr, sc), (lr, lc) = plan.shard_shape, plan.padded_local_shape
    count = rows * cols
    colours = ListedColormap(plt.get_cmap("tab10" if count <= 10 else "tab20").colors[:count])
    owner = (np.arange(N) // sr)[:, None] * cols + (np.arange(N) // sc)[None, :]
    after = np.full((rows * lr, cols * lc), -1)
    for i in range(rows):
        for j in range(cols):
            r, c = plan.row_map(i), plan.col_map(j)
            after[i * lr : i * lr + r.size, j * lc : j * lc + c.size] = owner[np.ix_(r, c)]

    fig, (left, right) = plt.subplots(1, 2, figsize=figsize or (11, 5.2), layout="constrained")
    style = dict(cmap=colours, vmin=0, vmax=count - 1, interpolation="nearest")
    left.imshow(owner, **style)
    left.set_title(f"block sharding P(r, c): N={N}, {rows} x {cols} processes")
    right.set_facecolor("0.85")
    right.imshow(np.ma.masked_less(after, 0), **style)
    right.set_title(f"2D block-cyclic, tile {t}: local arrays {lr} x {lc}")
    for k in range(1, rows * lr // t):
        right.axhline(k * t - 0.5, color="white", lw=0.4)
    for k in range(1, cols * lc // t):
        right.axvline(k * t - 0.5, color="white", lw=0.4)
    for i in range(1, rows):
        right.axhline(i * lr - 0.5, color="black", lw=2)
        left.axhline(i * sr - 0.5, color="black", lw=2)
    for j in range(1, cols):
        right.axvline(j * lc - 0.5, color="black", lw=2)
        left.axvline(j * sc - 0.5, color="black", lw=2)
    blocks = -(-N // t)
    if blocks <= 16:
        for bi in range(blocks):
            for bj in range(blocks):
                i, j = bi % rows, bj % cols
                y = i * lr + (bi // rows) * t + (min(t, N - bi * t) - 1) / 2
                x = j * lc + (bj // cols) * t + (min(t, N - bj * t) - 1) / 2
                right.text(x, y, f"{bi},{bj}", ha="center", va="center", fontsize=6, color="w")
    for axes, (a, b) in ((left, (sr, sc)), (right, (lr, lc))):
        axes.set_xticks(
            [j * b + (b - 1) / 2 for j in range(cols)], [f"col {j}" for j in range(cols)]
        )
        axes.set_yticks(
            [i * a + (a - 1) / 2 for i in range(rows)], [f"row {i}" for i in range(rows)]
        )
    return fig
