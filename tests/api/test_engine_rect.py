"""What backend "mp"'s rectangular routines on GPUs hand cuSOLVERMp (``jaxmg._engine_rect``):
each process's local array of the engine's 2D block-cyclic tiles, made in JAX from JAX's blocks
(cuSOLVERMp has no p?gemr2d). Checked on CPU devices against :class:`jaxmg_layout.BlockCyclic2D`
(ScaLAPACK's layout, independent of the relayout), for a rectangular ``A`` on a grid and both
1D forms; the engine itself runs on the emulator in tests/mpi/test_cusolvermp.py."""

import types

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxmg import _engine_rect
from jaxmg_layout import BlockCyclic2D

pytestmark = pytest.mark.usefixtures("once_per_suite")


@pytest.mark.parametrize(
    ("grid", "shape", "tile"),
    [((2, 2), (12, 8), 2), ((2, 2), (8, 12), 3), ((4, 1), (16, 6), 2), ((1, 4), (6, 16), 4)],
)
def test_tiles_are_the_engines_local_arrays(cpu_devices, grid, shape, tile):
    rows, cols = grid
    mesh = jax.make_mesh(grid, ("r", "c"), devices=cpu_devices[:4])
    spec = P("r" if rows > 1 else None, "c" if cols > 1 else None)
    if rows > 1 and cols > 1:
        spec = P("r", "c")
    geometry = types.SimpleNamespace(blocks_grid=grid, spec=spec)
    m, n = shape
    a = np.arange(m * n, dtype=np.float64).reshape(m, n) + 1
    plan = BlockCyclic2D.make(m, n, grid, tile)

    def body(block):
        return _engine_rect._tiles(geometry, block, tile)[None, None]

    placed = jax.device_put(a, NamedSharding(mesh, spec))
    out = jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=P("r", "c"), check_vma=False)(
        placed
    )
    out = np.asarray(out)
    for pr in range(rows):
        for pc in range(cols):
            # The local block, then zeros (the engine reads LLD from the array's shape).
            expected = plan.local_block(a, pr, pc)
            lr, lc = expected.shape
            local = out[pr, pc]
            assert local.shape[0] >= lr and local.shape[1] >= lc, (local.shape, expected.shape)
            np.testing.assert_array_equal(local[:lr, :lc], expected, err_msg=f"({pr}, {pc})")
            assert not local[lr:].any() and not local[:, lc:].any()
