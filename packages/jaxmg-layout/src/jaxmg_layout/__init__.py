"""jaxmg-layout: the 1D block-cyclic column layout that cuSolverMg needs, for sharded arrays.

Pure JAX and numpy: tile-size validation and padding (``calculate_*``), the layout plan of
one call (:class:`CyclicPlan`), the same relayout as in-place column moves for a native
executor (:func:`in_place_moves`), the relayout between JAX's block sharding and the
block-cyclic layout (``cyclic_1d_layout`` on global arrays, ``cyclic_1d_no_shardmap`` on
local shards inside ``shard_map``), and a picture of it (``plot_layout``, needs matplotlib).
The 2D block-cyclic layout of ScaLAPACK and cuSOLVERMp for matrices sharded ``P(r, c)``: its
index math (:class:`BlockCyclic2D`, :func:`numroc`), the relayout (``cyclic_2d_layout``,
``cyclic_2d_no_shardmap`` and their undo) and a picture (``plot_layout_2d``).
"""

import importlib.metadata
import pathlib
import tomllib

from ._moves import InPlaceMoves as InPlaceMoves, in_place_moves as in_place_moves
from ._plan import (
    CyclicPlan as CyclicPlan,
    calculate_all_valid_T_A as calculate_all_valid_T_A,
    calculate_padding as calculate_padding,
    calculate_valid_T_A as calculate_valid_T_A,
)
from ._plan2d import BlockCyclic2D as BlockCyclic2D, numroc as numroc
from ._plot import plot_layout as plot_layout, plot_layout_2d as plot_layout_2d
from ._relayout import (
    cyclic_1d_layout as cyclic_1d_layout,
    cyclic_1d_no_shardmap as cyclic_1d_no_shardmap,
    undo_cyclic_1d_layout as undo_cyclic_1d_layout,
    undo_cyclic_1d_no_shardmap as undo_cyclic_1d_no_shardmap,
)
from ._relayout2d import (
    cyclic_2d_layout as cyclic_2d_layout,
    cyclic_2d_no_shardmap as cyclic_2d_no_shardmap,
    undo_cyclic_2d_layout as undo_cyclic_2d_layout,
    undo_cyclic_2d_no_shardmap as undo_cyclic_2d_no_shardmap,
)


def _version() -> str:
    """The version its pyproject.toml, the one source, gives: installed, from the package's
    metadata; from a checkout on ``sys.path`` (``gpu_validate.py`` runs so), from the file."""
    try:
        return importlib.metadata.version("jaxmg-layout")
    except importlib.metadata.PackageNotFoundError:
        pyproject = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"
        return tomllib.loads(pyproject.read_text())["project"]["version"]


__version__ = _version()
