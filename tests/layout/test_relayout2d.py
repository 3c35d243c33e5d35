"""The relayout from JAX's ``P(r, c)`` block sharding to the 2D block-cyclic layout, against an
element-by-element reference written from ScaLAPACK's definition of the layout.

Runs on every simulated device count, on each grid of that many devices (4: 1x4, 2x2, 4x1).
"""

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxmg_layout as jl


def grids():
    count = jax.device_count()
    return [(r, count // r) for r in range(1, count + 1) if count % r == 0]


def mesh_of(grid):
    devices = jax.devices()[: grid[0] * grid[1]]
    return jax.make_mesh(grid, ("r", "c"), devices=devices)


def reference(a, grid, tile):
    """Process (i, j)'s local array, zero-padded to whole tiles of its shard: global element
    (g, h) sits in block row g // tile, which lives on process row (g // tile) % rows at local
    block row (g // tile) // rows; columns likewise."""
    n = a.shape[0]
    rows, cols = grid
    lr = -(-(n // rows) // tile) * tile
    lc = -(-(n // cols) // tile) * tile
    out = np.zeros((rows, cols, lr, lc), a.dtype)
    for g in range(n):
        for h in range(n):
            bi, bj = g // tile, h // tile
            out[
                bi % rows, bj % cols, (bi // rows) * tile + g % tile, (bj // cols) * tile + h % tile
            ] = a[g, h]
    return out


def local_arrays(x, grid):
    rows, cols = grid
    x = np.asarray(x)
    return x.reshape(rows, x.shape[0] // rows, cols, x.shape[1] // cols).transpose(0, 2, 1, 3)


def check(n, T_A, grid, dtype=np.float64):
    rng = np.random.default_rng(n * 31 + T_A)
    a = rng.standard_normal((n, n)).astype(dtype)
    placed = jax.device_put(a, NamedSharding(mesh_of(grid), P("r", "c")))
    tile = min(T_A, n // grid[0], n // grid[1])
    laid = jl.cyclic_2d_layout(placed, T_A)
    assert laid.sharding == placed.sharding
    np.testing.assert_array_equal(local_arrays(laid, grid), reference(a, grid, tile))
    np.testing.assert_array_equal(np.asarray(jl.undo_cyclic_2d_layout(laid, T_A, n)), a)


@pytest.mark.parametrize("case", [(12, 2), (12, 5), (24, 7), (24, 100), (24, 1)])
def test_every_grid_of_this_device_count(case):
    n, T_A = case
    for grid in grids():
        if n % grid[0] == 0 and n % grid[1] == 0:
            check(n, T_A, grid)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.data())
def test_random_sizes(blocks, T_A, data):
    grid = data.draw(st.sampled_from(grids()))
    n = blocks * grid[0] * grid[1]
    check(n, T_A, grid)


def test_complex_and_float32_keep_their_values():
    grid = grids()[len(grids()) // 2]
    n = 6 * grid[0] * grid[1]
    check(n, 4, grid, np.complex64)
    check(n, 4, grid, np.float32)


def test_inside_a_users_shard_map_under_jit():
    grid = grids()[-1]
    n, T_A = 4 * grid[0] * grid[1], 3
    mesh = mesh_of(grid)
    a = np.arange(n * n, dtype=np.float64).reshape(n, n)

    @jax.jit
    def round_trip(x):
        def local(block):
            laid = jl.cyclic_2d_no_shardmap(block, T_A, ("r", "c"))
            return laid, jl.undo_cyclic_2d_no_shardmap(laid * 2, T_A, n, ("r", "c"))

        spec = P("r", "c")
        return jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=(spec, spec))(x)

    laid, back = round_trip(jax.device_put(a, NamedSharding(mesh, P("r", "c"))))
    tile = min(T_A, n // grid[0], n // grid[1])
    np.testing.assert_array_equal(local_arrays(laid, grid), reference(a, grid, tile))
    np.testing.assert_array_equal(np.asarray(back), 2 * a)


@pytest.mark.usefixtures("once_per_suite")
def test_plan_for_blocks():
    plan = jl.BlockCyclic2D.for_blocks(12, (2, 3), 5)
    assert plan.tile == 4 and plan.shard_shape == (6, 4)  # min(5, 12/2, 12/3)
    assert plan.padded_local_shape == (8, 4)
    for i in range(2):
        for j in range(3):
            local = plan.local_shape(i, j)
            assert local[0] <= 8 and local[1] <= 4
    with pytest.raises(ValueError, match="N=10 is not divisible by the 2 x 3 grid"):
        jl.BlockCyclic2D.for_blocks(10, (2, 3), 2)


@pytest.mark.usefixtures("once_per_suite")
def test_refusals_name_what_is_accepted():
    mesh = mesh_of((2, 2))
    cols = jax.device_put(jnp.zeros((8, 8)), NamedSharding(mesh, P(None, "c")))
    with pytest.raises(ValueError, match=r"sharded over two mesh axes, P\(r, c\)"):
        jl.cyclic_2d_layout(cols, 2)
    rect = jax.device_put(jnp.zeros((8, 4)), NamedSharding(mesh, P("r", "c")))
    with pytest.raises(ValueError, match="square matrix"):
        jl.cyclic_2d_layout(rect, 2)
    square = jax.device_put(jnp.zeros((8, 8)), NamedSharding(mesh, P("r", "c")))
    with pytest.raises(ValueError, match=r"has shape \(12, 12\), got \(8, 8\)"):
        jl.undo_cyclic_2d_layout(square, 3, 8)  # tile 3: local arrays 6 x 6


@pytest.mark.usefixtures("once_per_suite")
def test_plot_layout_2d():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    fig = jl.plot_layout_2d(24, (2, 3), 3)
    left, right = fig.axes
    assert "2 x 3 processes" in left.get_title()
    assert "tile 3: local arrays 12 x 9" in right.get_title()
    # Tile (3, 4) (rows 9-11, columns 12-14) is on process (1, 1) at local block (1, 1): its
    # centre is 12 + 3 + 1 rows and 9 + 3 + 1 columns into the picture of the local arrays.
    labels = {t.get_text(): t.get_position() for t in right.texts}
    assert labels["3,4"] == (13, 16)
