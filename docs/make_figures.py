"""Regenerate the README's layout figure: ``python docs/make_figures.py``."""

import pathlib

import matplotlib

matplotlib.use("Agg")

from jaxmg_layout import plot_layout  # noqa: E402

HERE = pathlib.Path(__file__).parent

if __name__ == "__main__":
    for n, ndev, tile in [(100, 4, 4), (12, 2, 2)]:
        fig = plot_layout(n, ndev, tile)
        path = HERE / f"layout_{n}x{n}_{ndev}dev.png"
        fig.savefig(path, dpi=110)
        print("wrote", path)
