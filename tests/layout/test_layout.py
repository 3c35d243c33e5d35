"""jaxmg_layout against hand-worked tables and a loop-based numpy reference.

Runs on every simulated device count (``--num-cpu-devices``); cases needing more devices than
the process has are skipped. The cases that do not depend on the process's device count (plan
tables, hand-worked cases on a device count of their own) run once, with 4 devices.
"""

import re

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxmg_layout as jl
from jaxmg_layout._plan import shift_applies

COLS, ROWS = P(None, "x"), P("x", None)


def reference_layout(A, ndev, T_A, form="cols"):
    """The block-cyclic global array, one column at a time (independent of the package)."""
    n = A.shape[0]
    s = n // ndev
    tile = min(T_A, s)
    width = -(-s // tile) * tile
    M = A if form == "cols" else A.T
    out = np.zeros((n, ndev * width), A.dtype)
    for col in range(n):
        k, offset = divmod(col, tile)
        device, slot = k % ndev, k // ndev
        out[:, device * width + slot * tile + offset] = M[:, col]
    return out if form == "cols" else out.T


def mesh_of(ndev, axis_type=AxisType.Explicit):
    return jax.make_mesh((ndev,), ("x",), devices=jax.devices()[:ndev], axis_types=(axis_type,))


def need(ndev):
    if jax.device_count() < ndev:
        pytest.skip(f"needs {ndev} devices, this process has {jax.device_count()}")


@pytest.mark.usefixtures("once_per_suite")
def test_readme_12x12_two_devices():
    need(2)
    N, T_A = 12, 2
    A = jnp.diag(jnp.arange(N, dtype=jnp.float32) + 1)
    A = jax.device_put(A, NamedSharding(mesh_of(2), COLS))
    A_bc = jl.cyclic_1d_layout(A, T_A)
    shards = sorted(A_bc.addressable_shards, key=lambda s: s.index[1].start)
    assert [s.data.shape for s in shards] == [(12, 6), (12, 6)]
    expected = {0: [0, 1, 4, 5, 8, 9], 1: [2, 3, 6, 7, 10, 11]}
    for device, shard in enumerate(shards):
        # diag(1..12): local column c is global column g exactly when entry (g, c) is g + 1.
        data = np.asarray(shard.data)
        cols = [int(np.flatnonzero(data[:, c])[0]) for c in range(6)]
        assert cols == expected[device]
        assert [data[g, c] for c, g in enumerate(cols)] == [g + 1 for g in cols]
    assert jl.calculate_padding(6, 2, 2) == 2


@pytest.mark.usefixtures("once_per_suite")
def test_readme_100x100_four_devices():
    assert jl.calculate_padding(25, 4, 4) == 7
    plan = jl.CyclicPlan.make(100, 4, 4)
    assert (plan.padding, plan.local_width, plan.num_tiles, plan.tile) == (7, 28, 25, 4)
    # Hand-worked: device 1 holds tiles 1, 5, 9, 13, 17, 21 (columns 4-7, 20-23, ...) and one
    # all-padding slot; tile 24 (columns 96-99) is device 0's last real tile.
    assert plan.local_tiles(1).tolist() == [1, 5, 9, 13, 17, 21]
    assert plan.local_tiles(0).tolist()[-1] == 24
    assert plan.local_to_global(1, np.arange(28)).tolist() == (
        [4, 5, 6, 7, 20, 21, 22, 23, 36, 37, 38, 39, 52, 53, 54, 55, 68, 69, 70, 71]
        + [84, 85, 86, 87, -1, -1, -1, -1]
    )


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.parametrize(
    "shard, ndev, T_A_max, shift",
    [
        # s=6, 2 devices: p = (-6) mod 2T; the shift applies iff p <= 6 (or T >= 6).
        (6, 2, 9, [1, 2, 3, 4, 5, 6, 7, 8]),
        # s=25, 4 devices: T=1 p=3 (9<=25), T=2 p=7 (21), T=3 p=11 (33 no), T=4 p=7 (21),
        # T=5 p=15 no, T=6 p=23 no, T=7 p=3 (9), T=8 p=7 (21), T=9..24 p>=11 no.
        (25, 4, 30, [1, 2, 4, 7, 8, 25, 26, 27, 28, 29]),
        # s=4, 4 devices: T=1 p=0; T=2 p=4 (12 no); T=3 p=8 no; T>=4 no relayout.
        (4, 4, 6, [1, 4, 5]),
    ],
)
def test_shift_relayout_applicability_hand_worked(shard, ndev, T_A_max, shift):
    """Which tile sizes the one-ppermute shift takes; every tile size is valid."""
    assert [t for t in range(1, T_A_max) if shift_applies(shard, t, ndev)] == shift
    assert jl.calculate_all_valid_T_A(shard, ndev, T_A_max) == list(range(1, T_A_max))
    for t in range(1, T_A_max):
        plan = jl.CyclicPlan.make(shard * ndev, ndev, t)
        assert plan.shift_relayout == (t in shift and t < shard)


@pytest.mark.usefixtures("once_per_suite")
def test_nearest_valid_tile_sizes():
    assert jl.calculate_valid_T_A(25, 5, 4, 30) == (4, 6)
    assert jl.calculate_valid_T_A(25, 1, 4, 30) == (None, 2)
    assert jl.calculate_valid_T_A(4, 4, 4, 5) == (3, None)
    assert jl.calculate_valid_T_A(3, 2, 4, 5) == (1, 3)  # shards narrower than the devices


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.parametrize(
    "args, error, pattern",
    [
        ((12, 2, 0), ValueError, "T_A must be a positive int, got 0"),
        ((12, 2, -3), ValueError, "T_A must be a positive int"),
        ((12, 2, 2.0), TypeError, "T_A must be a positive int"),
        ((12, 2, True), TypeError, "T_A must be a positive int"),
        ((13, 2, 2), ValueError, "not divisible"),
    ],
)
def test_plan_rejects_bad_arguments(args, error, pattern):
    with pytest.raises(error, match=pattern):
        jl.CyclicPlan.make(*args)


def test_no_relayout_for_wide_tiles_returns_input():
    ndev = jax.device_count()
    A = jax.device_put(jnp.ones((8 * ndev, 8 * ndev)), NamedSharding(mesh_of(ndev), COLS))
    assert jl.cyclic_1d_layout(A, 8) is A
    assert jl.cyclic_1d_layout(A, 1000) is A
    assert not jl.CyclicPlan.make(8 * ndev, ndev, 8).needs_relayout


@pytest.mark.usefixtures("once_per_suite")
def test_plan_tables_agree_with_reference():
    plan = jl.CyclicPlan.make(30, 3, 2)
    cmap = plan.column_map()
    ref = reference_layout(np.arange(30)[None, :].repeat(30, 0), 3, 2)[0]
    width = plan.local_width
    for device in range(3):
        real = cmap[device] >= 0
        np.testing.assert_array_equal(
            cmap[device][real], ref[device * width : (device + 1) * width][real]
        )
    device, local = plan.global_to_local(np.arange(30))
    np.testing.assert_array_equal(plan.local_to_global(device, local), np.arange(30))
    np.testing.assert_array_equal(plan.tile_owner, np.arange(15) % 3)
    np.testing.assert_array_equal(plan.tile_slot, np.arange(15) // 3)


def _layout_case(N, ndev, T_A, form, dtype=np.float64, jit=False, axis_type=AxisType.Explicit):
    rng = np.random.default_rng(N * 1000 + T_A)
    A = rng.standard_normal((N, N)).astype(dtype)
    spec = COLS if form == "cols" else ROWS
    a = jax.device_put(A, NamedSharding(mesh_of(ndev, axis_type), spec))
    forward = jax.jit(jl.cyclic_1d_layout, static_argnums=1) if jit else jl.cyclic_1d_layout
    undo = (
        jax.jit(jl.undo_cyclic_1d_layout, static_argnums=(1, 2))
        if jit
        else jl.undo_cyclic_1d_layout
    )
    a_bc = forward(a, T_A)
    np.testing.assert_array_equal(np.asarray(a_bc), reference_layout(A, ndev, T_A, form))
    assert a_bc.sharding.spec == spec
    back = undo(a_bc, T_A, N)
    np.testing.assert_array_equal(np.asarray(back), A)
    assert back.sharding.spec == spec


@pytest.mark.parametrize("sliced_select_max", [0, 1000], ids=["gather", "slices"])
@pytest.mark.parametrize("T_A", [5, 13])
def test_gather_route_both_selections(monkeypatch, sliced_select_max, T_A):
    """The gather route picks column groups with dynamic slices (short tables) or one XLA
    gather (long ones); both agree with the reference."""
    from jaxmg_layout import _relayout

    ndev = jax.device_count()
    if ndev == 1 or jl.CyclicPlan.make(25 * ndev, ndev, T_A).shift_relayout:
        pytest.skip("the shift route (or no relayout) serves this case")
    monkeypatch.setattr(_relayout, "_SLICED_SELECT_MAX", sliced_select_max)
    jax.clear_caches()  # traces made under the other setting must not be reused
    N = 25 * ndev
    a = jax.device_put(jnp.ones((N, N)), NamedSharding(mesh_of(ndev), COLS))
    hlo = jax.jit(jl.cyclic_1d_layout, static_argnums=1).lower(a, T_A).as_text()
    assert ("stablehlo.gather" in hlo) == (sliced_select_max == 0)
    for form in ("cols", "rows"):
        _layout_case(N, ndev, T_A, form, jit=True)
    jax.clear_caches()


@pytest.mark.parametrize("form", ["cols", "rows"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize(
    "dtype", [pytest.param(np.float32, marks=pytest.mark.dtype_sweep), np.complex128]
)
def test_layout_matches_reference(form, jit, dtype):
    ndev = jax.device_count()
    # Shift and gather relayouts, partial last tiles, tiles wider than the shard.
    # Shards narrower than the device count (1, 3) too.
    for s, T_A in [(6, 2), (25, 4), (25, 5), (16, 1), (9, 4), (8, 8), (12, 5), (10, 30), (1, 1),
                   (3, 2)]:  # fmt: skip
        _layout_case(s * ndev, ndev, T_A, form, dtype, jit)


def test_auto_axis_mesh():
    ndev = jax.device_count()
    T_A = 3
    _layout_case(8 * ndev, ndev, T_A, "cols", axis_type=AxisType.Auto)


def test_two_dimensional_mesh():
    """Sharded over one axis of a 2D mesh, replicated over the other."""
    if jax.device_count() % 2:
        pytest.skip("needs an even device count")
    ndev = jax.device_count() // 2
    mesh = jax.make_mesh((2, ndev), ("r", "x"), axis_types=(AxisType.Explicit,) * 2)
    N, T_A = 8 * ndev, 2
    A = np.arange(N * N, dtype=np.float64).reshape(N, N)
    a = jax.device_put(A, NamedSharding(mesh, P(None, "x")))
    a_bc = jl.cyclic_1d_layout(a, T_A)
    np.testing.assert_array_equal(np.asarray(a_bc), reference_layout(A, ndev, T_A))
    np.testing.assert_array_equal(np.asarray(jl.undo_cyclic_1d_layout(a_bc, T_A, N)), A)


def test_no_shardmap_inside_user_shard_map():
    ndev = jax.device_count()
    mesh = mesh_of(ndev)
    N, T_A = 8 * ndev, 3
    A = np.arange(N * N, dtype=np.float64).reshape(N, N)

    @jax.jit
    def roundtrip(a):
        def local(x):
            x_bc = jl.cyclic_1d_no_shardmap(x, T_A, "x")
            return x_bc, jl.undo_cyclic_1d_no_shardmap(x_bc, T_A, N, "x")

        return jax.shard_map(local, mesh=mesh, in_specs=COLS, out_specs=(COLS, COLS))(a)

    a_bc, back = roundtrip(jax.device_put(A, NamedSharding(mesh, COLS)))
    np.testing.assert_array_equal(np.asarray(a_bc), reference_layout(A, ndev, T_A))
    np.testing.assert_array_equal(np.asarray(back), A)


def pairs_with_data(N, ndev, T_A):
    """``(source, target)`` device pairs that share columns, block -> cyclic (by hand)."""
    s, tile = N // ndev, min(T_A, N // ndev)
    return {(col // s, (col // tile) % ndev) for col in range(N)} - {(d, d) for d in range(ndev)}


def permute_pairs(hlo):
    found = []
    for pairs in re.findall(r"collective-permute\(.*?source_target_pairs=\{(.*?)\}\}", hlo):
        found.append({tuple(map(int, p.split(","))) for p in pairs.strip("{").split("},{")})
    return found


@pytest.mark.parametrize("T_A", [4, 5, 8, 13])
@pytest.mark.parametrize("undo", [False, True], ids=["forward", "undo"])
def test_relayout_collectives(T_A, undo):
    """Shift: one collective-permute and one all-to-all. Gather: one collective-permute per
    device distance that carries data, over only the pairs that share columns; no all-to-all
    moving padding, no gathers."""
    ndev = jax.device_count()
    if ndev == 1:
        pytest.skip("no collectives on one device")
    N = 25 * ndev
    plan = jl.CyclicPlan.make(N, ndev, T_A)
    a = jax.device_put(jnp.ones((N, N)), NamedSharding(mesh_of(ndev), COLS))
    if undo:
        a = jl.cyclic_1d_layout(a, T_A)
        fn = jax.jit(jl.undo_cyclic_1d_layout, static_argnums=(1, 2))
        hlo = fn.lower(a, T_A, N).compile().as_text()
    else:
        hlo = jax.jit(jl.cyclic_1d_layout, static_argnums=1).lower(a, T_A).compile().as_text()
    assert "all-gather" not in hlo
    permutes = permute_pairs(hlo)
    if plan.shift_relayout:
        assert len(re.findall(r"\sall-to-all\(", hlo)) == 1
        assert len(permutes) == (1 if plan.padding else 0)
        return
    assert "all-to-all" not in hlo
    expected = pairs_with_data(N, ndev, T_A)
    if undo:
        expected = {(j, d) for d, j in expected}
    assert set().union(*permutes) == expected
    distances = [{(j - d) % ndev for d, j in pairs} for pairs in permutes]
    assert all(len(k) == 1 for k in distances)  # one permute per distance
    assert len({k.pop() for k in distances}) == len(permutes)


@pytest.mark.parametrize(
    "bad, error, pattern",
    [
        (
            lambda m, n: jax.device_put(jnp.ones((8 * n, 16 * n)), NamedSharding(m, COLS)),
            ValueError,
            "square",
        ),
        (
            lambda m, n: jax.device_put(jnp.ones((8 * n, 8 * n)), NamedSharding(m, P())),
            ValueError,
            "exactly one mesh axis",
        ),
        (lambda m, n: np.ones((8 * n, 8 * n)), TypeError, "NamedSharding"),
    ],
)
def test_layout_rejects_bad_arrays(bad, error, pattern):
    ndev = jax.device_count()
    with pytest.raises(error, match=pattern):
        jl.cyclic_1d_layout(bad(mesh_of(ndev), ndev), 2)


@pytest.mark.usefixtures("once_per_suite")
def test_layout_rejects_two_axis_sharding():
    if jax.device_count() < 4:
        pytest.skip("needs 4 devices")
    mesh = jax.make_mesh((2, 2), ("r", "x"), devices=jax.devices()[:4])
    a = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P("r", "x")))
    with pytest.raises(ValueError, match=r"exactly one mesh axis.*P\(None, ax\)"):
        jl.cyclic_1d_layout(a, 2)


def test_undo_rejects_wrong_width():
    ndev = jax.device_count()
    a = jax.device_put(jnp.ones((8 * ndev, 9 * ndev)), NamedSharding(mesh_of(ndev), COLS))
    with pytest.raises(ValueError, match="block-cyclic array has shape"):
        jl.undo_cyclic_1d_layout(a, 8, 8 * ndev)


@pytest.mark.usefixtures("once_per_suite")
def test_narrow_shards_hand_worked():
    """N=8 on 4 devices (2 columns each, fewer than the devices), T_A=1: tile k is column k,
    on device k % 4; T_A=2 is the whole shard (no relayout)."""
    plan = jl.CyclicPlan.make(8, 4, 1)
    np.testing.assert_array_equal(plan.column_map(), [[0, 4], [1, 5], [2, 6], [3, 7]])
    assert plan.needs_relayout and plan.local_width == 2
    wide = jl.CyclicPlan.make(8, 4, 2)
    np.testing.assert_array_equal(wide.column_map(), [[0, 1], [2, 3], [4, 5], [6, 7]])
    assert not wide.needs_relayout
    # N=40 on 8 devices (5 each), T_A=2: 20 tiles, 3 slots per device, the last one partly
    # padding on devices 4-7.
    plan = jl.CyclicPlan.make(40, 8, 2)
    assert plan.local_width == 6
    np.testing.assert_array_equal(plan.column_map()[0], [0, 1, 16, 17, 32, 33])
    np.testing.assert_array_equal(plan.column_map()[7], [14, 15, 30, 31, -1, -1])


@given(data=st.data())
def test_property_every_tile_round_trips(data):
    ndev = jax.device_count()
    s = data.draw(st.integers(1, 24), label="shard")
    T_A = data.draw(st.integers(1, s + 3), label="T_A")
    form = data.draw(st.sampled_from(["cols", "rows"]), label="form")
    _layout_case(s * ndev, ndev, T_A, form, np.float32)


@pytest.mark.usefixtures("once_per_suite")
@given(s=st.integers(1, 200), ndev=st.integers(1, 16), T_A=st.integers(1, 220))
def test_property_plan_tables(s, ndev, T_A):
    plan = jl.CyclicPlan.make(s * ndev, ndev, T_A)
    p = (-s) % (ndev * T_A)
    assert plan.shift_relayout == (T_A < s and (ndev - 1) * p <= s)
    assert plan.local_width % plan.tile == 0 and plan.local_width >= s
    cmap = plan.column_map()
    real = np.sort(cmap[cmap >= 0])
    np.testing.assert_array_equal(real, np.arange(s * ndev))  # a permutation plus padding


@pytest.mark.usefixtures("once_per_suite")
def test_plot_layout():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    fig = jl.plot_layout(100, 4, 4)
    assert len(fig.axes) == 2
    assert "12 zero columns in all" in fig.axes[1].get_title()
