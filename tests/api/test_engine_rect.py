"""What backend "mp"'s rectangular routines on GPUs hand cuSOLVERMp
(``jaxmg.decompositions.engine_routines``):
each process's local array of the engine's 2D block-cyclic tiles, made in JAX from JAX's blocks
(cuSOLVERMp has no p?gemr2d). Checked on CPU devices against :class:`jaxmg_layout.BlockCyclic2D`
(ScaLAPACK's layout, independent of the relayout), for a rectangular ``A`` on a grid and both
1D forms; the engine itself runs on the emulator in tests/mpi/test_cusolvermp.py."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxmg_cuda.mp
from jaxmg.decompositions import engine_routines as _engine_rect
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


@pytest.mark.parametrize(
    ("grid", "shape", "tile"),
    [((2, 2), (12, 8), 2), ((2, 2), (8, 12), 3), ((4, 1), (16, 6), 4), ((1, 4), (6, 16), 4)],
)
def test_local_arrays_of_tiles_go_back_to_blocks(cpu_devices, grid, shape, tile):
    """_from_tiles takes each process's local array of tiles, its extents rounded up to whole
    tiles as the GPU engine returns qr's results (BlockCyclic2D.padded_local_block, padding
    included: 3 does not divide the blocks of 8 x 12, 4 not the 6 rows or columns), to its
    block of JAX's sharding."""
    rows, cols = grid
    mesh = jax.make_mesh(grid, ("r", "c"), devices=cpu_devices[:4])
    spec = P("r" if rows > 1 else None, "c" if cols > 1 else None)
    geometry = types.SimpleNamespace(blocks_grid=grid, spec=spec)
    m, n = shape
    a = np.arange(m * n, dtype=np.float64).reshape(m, n) + 1
    plan = BlockCyclic2D.make(m, n, grid, tile)
    local = np.stack(
        [np.stack([plan.padded_local_block(a, pr, pc) for pc in range(cols)]) for pr in range(rows)]
    )
    placed = jax.device_put(local, NamedSharding(mesh, P("r", "c")))

    def body(x):
        return _engine_rect._from_tiles(geometry, x[0, 0], tile, shape)

    out = jax.shard_map(body, mesh=mesh, in_specs=P("r", "c"), out_specs=spec, check_vma=False)(
        placed
    )
    np.testing.assert_array_equal(np.asarray(out), a)


@pytest.mark.parametrize(
    ("form", "shape", "tile"),
    [
        ("rows", (16, 6), 4),
        ("cols", (6, 16), 4),
        ("grid", (12, 8), 4),
        ("grid", (8, 4), 2),
        ("rows", (32, 8), 2),
    ],
)
def test_gpu_results_in_blocks_round_trip(cpu_devices, monkeypatch, form, shape, tile):
    """_mp_call's GPU path without a GPU: a stand-in engine hands back its local array of A's
    tiles as a result of A's shape, padded to the shape the GPU engine gives it
    (jaxmg_cuda.mp.result_shape), and zeros as a second result, R's ``K x N``; what comes out
    must be A, sharded like A. The tile (T_A=64 asked) is cut to at most every sharded block of
    A and of a result in blocks: R's 2 rows per device of (32, 8) by rows need 2."""
    from jaxmg.describe.call import Geometry
    from jaxmg.engines import ENGINES

    mesh = jax.make_mesh((2, 2), ("r", "c"), devices=cpu_devices[:4])
    if form != "grid":
        mesh = jax.make_mesh((4,), ("x",), devices=cpu_devices[:4])
    row_axis = "r" if form == "grid" else None
    axis = "c" if form == "grid" else "x"
    geometry = Geometry(
        mesh, axis, form, 4, "gpu", (-1,) * 4, engine=ENGINES["mp"], row_axis=row_axis
    )
    monkeypatch.setattr(jaxmg_cuda.mp, "nccl_id", lambda: np.zeros(16, np.int64))
    tiles = []

    def engine(local_t, position, *, m, n, grid, T_A, nccl_id, blocks):
        tiles.append(T_A)
        out = jnp.zeros(jaxmg_cuda.mp.result_shape(m, n, grid, blocks, T_A), local_t.dtype)
        out = out.at[: local_t.shape[0], : local_t.shape[1]].set(local_t)
        r = jnp.zeros(jaxmg_cuda.mp.result_shape(min(m, n), n, grid, blocks, T_A), out.dtype)
        return out, r, jnp.zeros((1,), jnp.int32)

    m, n = shape
    a = np.arange(m * n, dtype=np.float64).reshape(m, n) + 1
    placed = jax.device_put(a, NamedSharding(mesh, geometry.spec))
    shapes = ((m, n), (min(m, n), n))
    out, r, status = _engine_rect._mp_call(geometry, engine, 64, placed, shapes=shapes)
    assert tiles[0] == tile, tiles
    assert not np.asarray(r).any() and r.shape == shapes[1]
    assert out.sharding.spec == geometry.spec
    np.testing.assert_array_equal(np.asarray(out), a)
