"""The 2D block-cyclic layout's index math against ScaLAPACK's (hand-worked and measured) and
against the 1D plan it generalises."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import jaxmg_layout
from jaxmg_layout import BlockCyclic2D, numroc

pytestmark = pytest.mark.usefixtures("once_per_suite")


# Local shapes of a 10 x 10 matrix in 3 x 3 blocks, as MKL's ScaLAPACK (NUMROC, DESCINIT and a
# PDPOTRF checked against numpy) reported them under `mpiexec -n 2` and `-n 4`.
MEASURED = {
    (1, 2): {(0, 0): (10, 6), (0, 1): (10, 4)},
    (2, 2): {(0, 0): (6, 6), (0, 1): (6, 4), (1, 0): (4, 6), (1, 1): (4, 4)},
}


@pytest.mark.parametrize("grid", list(MEASURED))
def test_local_shapes_match_scalapack(grid):
    plan = BlockCyclic2D.make(10, 10, grid, 3)
    for process, shape in MEASURED[grid].items():
        assert plan.local_shape(*process) == shape


def test_hand_worked_maps():
    # 7 x 11 on a 2 x 3 grid in 2 x 2 blocks: block rows 0..3 go to process rows 0,1,0,1;
    # block columns 0..5 to process columns 0,1,2,0,1,2.
    plan = BlockCyclic2D.make(7, 11, (2, 3), 2)
    assert plan.row_map(0).tolist() == [0, 1, 4, 5]
    assert plan.row_map(1).tolist() == [2, 3, 6]
    assert plan.col_map(0).tolist() == [0, 1, 6, 7]
    assert plan.col_map(1).tolist() == [2, 3, 8, 9]
    assert plan.col_map(2).tolist() == [4, 5, 10]
    assert plan.local_shape(1, 2) == (3, 3)
    assert plan.leading_dimension(1) == 3
    assert [int(v) for v in plan.global_to_local(6, 10)] == [1, 2, 2, 2]
    assert [int(v) for v in plan.local_to_global(1, 2, 2, 2)] == [6, 10]


def test_numroc_cases():
    assert numroc(10, 3, 0, 2) == 6 and numroc(10, 3, 1, 2) == 4  # blocks 0,2 / 1,3
    assert numroc(9, 3, 0, 3) == 3 and numroc(9, 3, 2, 3) == 3  # whole blocks
    assert numroc(2, 3, 1, 4) == 0  # more processes than blocks
    assert sum(numroc(100, 7, p, 6) for p in range(6)) == 100


@given(
    m=st.integers(1, 40),
    n=st.integers(1, 40),
    rows=st.integers(1, 4),
    cols=st.integers(1, 4),
    tile=st.integers(1, 9),
)
def test_every_element_once_and_back(m, n, rows, cols, tile):
    plan = BlockCyclic2D.make(m, n, (rows, cols), tile)
    a = np.arange(m * n, dtype=np.float64).reshape(m, n)
    blocks = [[plan.local_block(a, pr, pc) for pc in range(cols)] for pr in range(rows)]
    assert sum(b.size for row in blocks for b in row) == m * n
    np.testing.assert_array_equal(plan.assemble(blocks), a)
    i, j = np.meshgrid(np.arange(m), np.arange(n), indexing="ij")
    pr, pc, li, lj = plan.global_to_local(i, j)
    for r in range(rows):
        for c in range(cols):
            mine = (pr == r) & (pc == c)
            np.testing.assert_array_equal(blocks[r][c][li[mine], lj[mine]], a[mine])
    gi, gj = plan.local_to_global(pr, pc, li, lj)
    np.testing.assert_array_equal(gi, i)
    np.testing.assert_array_equal(gj, j)


@given(ndev=st.integers(1, 6), per_device=st.integers(1, 8), tile=st.integers(1, 10))
def test_one_row_of_processes_is_the_1d_column_layout(ndev, per_device, tile):
    """On a 1 x ndev grid the columns are cuSolverMg's 1D block-cyclic layout."""
    n = ndev * per_device
    flat = jaxmg_layout.CyclicPlan.make(n, ndev, tile)
    plan = BlockCyclic2D.make(n, n, (1, ndev), flat.tile)
    for d, columns in enumerate(flat.column_map()):
        np.testing.assert_array_equal(plan.col_map(d), columns[columns >= 0])


def test_bad_arguments_say_what_is_accepted():
    with pytest.raises(TypeError, match=r"grid must be a \(rows, cols\) pair"):
        BlockCyclic2D.make(4, 4, 2, 1)
    with pytest.raises(ValueError, match="tile must be a positive int"):
        BlockCyclic2D.make(4, 4, (1, 2), 0)
    plan = BlockCyclic2D.make(4, 4, (2, 2), 1)
    with pytest.raises(IndexError, match=r"not on the 2 x 2 grid"):
        plan.local_shape(2, 0)
    with pytest.raises(IndexError, match="global index out of range"):
        plan.global_to_local(4, 0)
    with pytest.raises(ValueError, match="the layout is of 4 x 4"):
        plan.local_block(np.zeros((3, 4)), 0, 0)
