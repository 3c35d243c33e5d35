"""jaxmg_layout.in_place_moves against a column-at-a-time reference of the block-cyclic layout.

The moves are run here by a strict numpy executor that refuses what the native one must never
see (overlapping ranges, a range across two devices, staging beyond the stated width, two moves
of one round that touch what the other writes) and runs each round as concurrent copies would.
Pure numpy, the device count drawn or written in each case: it runs once, in the 4-device
pytest process (``once_per_suite`` in tests/conftest.py).
"""

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

import jaxmg_layout as jl

pytestmark = pytest.mark.usefixtures("once_per_suite")


def execute(buffers, moves, width, staging_width):
    """Run ``moves`` over ``buffers`` (``[ndev * width]`` labels, one per column), round by
    round; within a round every move reads the state before the round (as concurrent copies
    would), which is only right when no move touches what another one of its round writes."""
    ends = len(buffers)
    ndev = ends // width
    space = np.concatenate([buffers, np.full(ends, -2)])  # then each device's staging
    rounds = moves[:, 0]
    assert (np.diff(rounds) >= 0).all(), "moves must come in round order"
    for r in np.unique(rounds):
        batch = moves[rounds == r, 1:]
        for i, (source, destination, count) in enumerate(batch):
            assert count >= 1
            assert not (source < destination + count and destination < source + count), "overlap"
            for at in (source, destination):
                assert 0 <= at < 2 * ends
                assert at // width == (at + count - 1) // width, "across devices"
                if at >= ends:
                    assert (at - ends) % width + count <= staging_width, "beyond staging"
            for j, (s2, d2, c2) in enumerate(batch):
                if i != j:
                    for a, b in ((destination, s2), (destination, d2), (source, d2)):
                        assert not (a < b + c2 and b < a + count), f"round {r} conflicts"
        before = space.copy()
        for source, destination, count in batch:
            space[destination : destination + count] = before[source : source + count]
    assert ndev * width == ends
    return space[:ends]


def block_buffers(plan, moves):
    """Each device's buffer in the block layout: column labels at ``offsets[d]``, -1 elsewhere."""
    s, w = plan.shard_size, moves.width
    out = np.full(plan.ndev * w, -1)
    for d in range(plan.ndev):
        start = d * w + moves.offsets[d]
        out[start : start + s] = np.arange(d * s, (d + 1) * s)
    return out


def cyclic_reference(plan, width):
    """Column label at every position of the block-cyclic layout (-1: padding), by loop."""
    out = np.full(plan.ndev * width, -1)
    for col in range(plan.N):
        k, offset = divmod(col, plan.tile)
        out[(k % plan.ndev) * width + (k // plan.ndev) * plan.tile + offset] = col
    return out


def check_round_trip(n, ndev, T_A):
    plan = jl.CyclicPlan.make(n, ndev, T_A)
    moves = jl.in_place_moves(plan)
    assert moves.width % plan.tile == 0 and plan.local_width <= moves.width
    assert moves.width <= plan.local_width + plan.tile  # at most one tile of extra room
    assert all(o + plan.shard_size <= moves.width for o in moves.offsets)
    block = block_buffers(plan, moves)
    cyclic = execute(block, moves.to_cyclic, moves.width, moves.staging_width)
    want = cyclic_reference(plan, moves.width)
    real = want >= 0
    np.testing.assert_array_equal(cyclic[real], want[real])
    back = execute(cyclic, moves.from_cyclic, moves.width, moves.staging_width)
    placed = block >= 0
    np.testing.assert_array_equal(back[placed], block[placed])
    return plan, moves


@pytest.mark.parametrize(
    "n, ndev, T_A",
    [(12, 2, 2), (12, 2, 4), (100, 4, 4), (2048, 4, 256), (1000, 8, 7), (30000, 4, 256)],
)
def test_round_trip_and_staging_of_about_a_tile(n, ndev, T_A):
    plan, moves = check_round_trip(n, ndev, T_A)
    assert moves.staging_width <= 2 * plan.tile  # measured bound, not proven (see _moves)
    assert moves.to_cyclic[-1, 0] + 1 <= len(moves.to_cyclic)


def test_aligned_tiles_move_whole():
    """N=2048 on 4 devices, T_A=256: 8 tiles, 6 of them not home; one cycle through staging."""
    plan, moves = check_round_trip(2048, 4, 256)
    assert moves.width == 512 and not moves.offsets.any()
    assert set(moves.to_cyclic[:, 3]) == {256}
    # Tile k at (device, slot) (k // 2, k % 2) goes to (k % 4, k // 4): tiles 0 and 7 stay,
    # 1 -> 2 -> 4 -> 1 and 3 -> 6 -> 5 -> 3 are two cycles (each tile moves into the place of
    # the next). Both are cut through staging at once, so the moves take fewer rounds than
    # there are moves.
    assert moves.staging_width == 256
    rounds = moves.to_cyclic[-1, 0] + 1
    assert rounds < len(moves.to_cyclic), (rounds, len(moves.to_cyclic))


def test_worked_example_12_columns_2_devices_tile_4():
    """s=6: device 1's block starts at column 6 = tile 1 + 2, so it sits at offset 2; W=8."""
    plan, moves = check_round_trip(12, 2, 4)
    assert moves.width == 8
    assert moves.offsets.tolist() == [0, 2]
    # Tile 1 (columns 4..7) is split: 4, 5 on device 0, and 6, 7 on device 1 already at their
    # offsets 2, 3 of its slot 0 (positions 10, 11). Columns 4, 5 join them (positions 4, 5 ->
    # 8, 9); then tile 2 (8..11, positions 12..15) fills device 0's slot 1 (positions 4..7).
    # Padding opens the cycle: no staging.
    assert moves.to_cyclic.tolist() == [[0, 4, 8, 2], [1, 12, 4, 4]]
    assert moves.staging_width == 0


def test_no_relayout_no_moves():
    plan = jl.CyclicPlan.make(16, 4, 4)
    moves = jl.in_place_moves(plan)
    assert moves.to_cyclic.shape == (0, 4) and moves.staging_width == 0
    assert moves.width == 4


def test_cached_and_read_only():
    plan = jl.CyclicPlan.make(100, 4, 4)
    assert jl.in_place_moves(plan) is jl.in_place_moves(plan)
    with pytest.raises(ValueError):
        jl.in_place_moves(plan).to_cyclic[0, 0] = 1


@settings(max_examples=60, deadline=None)
@given(ndev=st.integers(1, 9), per_device=st.integers(1, 60), data=st.data())
def test_round_trip_property(ndev, per_device, data):
    T_A = data.draw(st.integers(1, per_device + 1))
    check_round_trip(ndev * per_device, ndev, T_A)


def test_cycles_are_cut_into_rounds_that_run_at_once():
    """N=32768 on 8 devices, T_A=256: the tile permutation's cycles, cut through every device's
    staging, take 34 rounds for 150 copies (one cycle after another would take 144)."""
    plan, moves = check_round_trip(32768, 8, 256)
    for table in (moves.to_cyclic, moves.from_cyclic):
        rounds = table[-1, 0] + 1
        assert rounds * 3 < len(table), (rounds, len(table))
    assert moves.staging_width == plan.tile
