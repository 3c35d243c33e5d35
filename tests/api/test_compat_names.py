"""jaxmg 0.0.x's names that its own tests import: ``jaxmg.utils`` (``random_psd``,
``JaxMgWarning``), ``cyclic_1d`` and ``verify_cyclic`` (0.0.7), ``manual_cyclic_1d_layout``
(0.0.1) and ``plot_block_to_cyclic``, each against its 0.0.x behaviour: numpy, and layouts
worked by hand from the original README (device 0 of diag(1..12) on 2 devices with ``T_A=2``
holds columns 0, 1, 4, 5, 8, 9).
"""

import functools
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxmg
import jaxmg_cuda
from jaxmg.utils import JaxMgWarning, random_psd

ROWS, COLS = P("x", None), P(None, "x")


def reference_layout(A, T_A, ndev, axis=0):
    """The 1D block-cyclic layout by its definition: tile k (T_A rows) goes to device
    k % ndev, after the tiles it already holds; every device's block is ceil(s/T_A)*T_A rows
    (s = N/ndev), zeros after its tiles; T_A >= s leaves A as it is."""
    A = np.asarray(A)
    if axis == 1:
        return reference_layout(A.T, T_A, ndev).T
    N = A.shape[0]
    s = N // ndev
    if T_A >= s:
        return A
    L = -(-s // T_A) * T_A
    out = np.zeros((ndev * L,) + A.shape[1:], A.dtype)
    filled = [0] * ndev
    for k, start in enumerate(range(0, N, T_A)):
        d = k % ndev
        tile = A[start : start + T_A]
        out[d * L + filled[d] : d * L + filled[d] + len(tile)] = tile
        filled[d] += T_A
    return out


# Hand-worked: for each device, the global columns of its block, -1 for a zero column.
HAND_TABLES = [
    # the original README: N=12 on 2 devices, T_A=2 (shards of 6, no padding)
    (12, 2, 2, [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, 10, 11]]),
    # shards of 5, tiles of 2: 5 tiles, 3 on device 0, 2 and a zero tile on device 1
    (10, 2, 2, [[0, 1, 4, 5, 8, 9], [2, 3, 6, 7, -1, -1]]),
    # shards of 3 on 3 devices, tiles of 2: tile 4 is the single column 8
    (9, 3, 2, [[0, 1, 6, 7], [2, 3, 8, -1], [4, 5, -1, -1]]),
    # tiles of 1: plain round robin
    (6, 2, 1, [[0, 2, 4], [1, 3, 5]]),
]


def from_table(A, table):
    """A's columns placed as the hand table says (zero columns at -1)."""
    picks = [c for block in table for c in block]
    return np.stack([A[:, c] if c >= 0 else np.zeros(A.shape[0], A.dtype) for c in picks], 1)


def numbered(n, m=None, dtype=np.float64):
    """An n x m matrix whose entries all differ (complex ones in their imaginary part too)."""
    m = n if m is None else m
    A = np.arange(n * m, dtype=np.float64).reshape(n, m) + 1
    return (A + 1j * A[::-1]).astype(dtype) if np.dtype(dtype).kind == "c" else A.astype(dtype)


# --- jaxmg.utils -----------------------------------------------------------------------------


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
def test_random_psd_is_the_hermitian_positive_definite_matrix_of_0_0_x(dtype):
    n, seed = 24, 1234
    A = random_psd(n, dtype=dtype, seed=seed)
    assert A.shape == (n, n) and A.dtype == np.dtype(dtype)
    # 0.0.x's construction, recomputed in numpy from the same draw
    G = np.asarray(jax.random.normal(jax.random.key(seed), (n, n), dtype=dtype), np.complex128)
    expected = G @ G.conj().T / n + 1e-5 * np.eye(n)
    tol = 1e-5 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-12
    np.testing.assert_allclose(np.asarray(A), expected, rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(A), np.asarray(A).conj().T, rtol=tol, atol=tol)
    assert np.linalg.eigvalsh(expected).min() >= 1e-5 * (1 - 1e-9)
    np.testing.assert_array_equal(np.asarray(random_psd(n, dtype, seed)), np.asarray(A))
    assert not np.allclose(np.asarray(random_psd(n, dtype, seed + 1)), np.asarray(A))


@pytest.mark.usefixtures("once_per_suite")
def test_random_psd_factors_and_refuses_a_bad_size():
    A = np.asarray(random_psd(40, jnp.float64, 7))
    np.linalg.cholesky(A)  # positive definite in double precision
    with pytest.raises(ValueError, match="n must be a positive int, got 0"):
        random_psd(0, jnp.float64, 0)
    with pytest.raises(TypeError, match="n must be a positive int, got 2.5"):
        random_psd(2.5, jnp.float64, 0)


@pytest.mark.usefixtures("once_per_suite")
def test_jaxmg_warning_is_the_user_warning_jaxmg_issues():
    """0.0.x lowered a syevd tile over 1024 with a JaxMgWarning; jaxmg's warning is one, and
    still a UserWarning for filters on that. The mesh is an abstract GPU mesh, lowered for CUDA
    (as in test_dropin)."""
    assert issubclass(JaxMgWarning, UserWarning)
    if not jaxmg_cuda.has_cuda_support():
        pytest.skip("jaxmg-cuda was built without CUDA: its GPU targets cannot be lowered")
    mesh = jax.sharding.AbstractMesh(
        (2,), ("x",), axis_types=(AxisType.Explicit,),
        abstract_device=jax.sharding.AbstractDevice("gpu", None, "cuda"),
    )  # fmt: skip
    arg = jax.ShapeDtypeStruct((4096, 4096), jnp.float64, sharding=NamedSharding(mesh, COLS))

    def lower():
        fn = jax.jit(lambda a: jaxmg.syevd(a, 4096, mesh=mesh))
        return fn.trace(arg).lower(lowering_platforms=("cuda",))

    with pytest.warns(JaxMgWarning, match="jaxmg.syevd: .* at most 1024; T_A=4096 is lowered"):
        lower()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", JaxMgWarning)  # filtering on the class silences it
        lower()


# --- manual_cyclic_1d_layout (0.0.1) -----------------------------------------------------------


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.parametrize(("N", "ndev", "T_A", "table"), HAND_TABLES)
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_manual_cyclic_1d_layout_matches_hand_worked_tables(N, ndev, T_A, table, dtype):
    A = numbered(N, dtype=dtype)
    out = jaxmg.manual_cyclic_1d_layout(jnp.asarray(A), T_A, ndev)
    assert out.dtype == np.dtype(dtype)  # 0.0.1 cast to its default float; kept here
    np.testing.assert_array_equal(np.asarray(out), from_table(A, table))
    np.testing.assert_array_equal(np.asarray(out), reference_layout(A, T_A, ndev, axis=1))


@pytest.mark.usefixtures("once_per_suite")
def test_manual_cyclic_1d_layout_wide_tiles_rectangular_and_errors():
    A = numbered(6)
    for T_A in (3, 5):  # at least the shard (3 columns): already block-cyclic, as in 0.0.1
        np.testing.assert_array_equal(np.asarray(jaxmg.manual_cyclic_1d_layout(A, T_A, 2)), A)
    B = numbered(3, 10)  # columns are laid out; any number of rows
    np.testing.assert_array_equal(
        np.asarray(jaxmg.manual_cyclic_1d_layout(B, 2, 2)), from_table(B, HAND_TABLES[1][3])
    )
    with pytest.raises(ValueError, match="N=9 is not divisible by ndev=2"):
        jaxmg.manual_cyclic_1d_layout(numbered(9), 2, 2)
    with pytest.raises(ValueError, match="T_A must be a positive int"):
        jaxmg.manual_cyclic_1d_layout(A, 0, 2)
    with pytest.raises(ValueError, match="a must be a 2-D matrix"):
        jaxmg.manual_cyclic_1d_layout(np.ones(6), 2, 2)


# --- cyclic_1d and verify_cyclic (0.0.7) ------------------------------------------------------


def mesh_all():
    return jax.make_mesh((jax.device_count(),), ("x",), axis_types=(AxisType.Explicit,))


@pytest.mark.parametrize("s", [3, 5])
@pytest.mark.parametrize("T_A", [1, 2, 5])
def test_cyclic_1d_as_0_0_7_called_it(s, T_A):
    """0.0.7's test: row-sharded A, ``jax.jit(partial(cyclic_1d, mesh=..., in_specs=(P("x",
    None),)), static_argnums=1)``, checked with verify_cyclic; here also against numpy."""
    ndev = jax.device_count()
    mesh = mesh_all()
    A = numbered(ndev * s)
    placed = jax.device_put(A, NamedSharding(mesh, ROWS))
    fn = jax.jit(functools.partial(jaxmg.cyclic_1d, mesh=mesh, in_specs=(ROWS,)), static_argnums=1)
    out = fn(placed, T_A=T_A)
    expected = reference_layout(A, T_A, ndev)
    np.testing.assert_array_equal(np.asarray(out), expected)
    assert out.sharding.spec == ROWS
    L = expected.shape[0] // ndev
    for shard in out.addressable_shards:  # device d holds its tiles, in order
        d = mesh.devices.tolist().index(shard.device)
        np.testing.assert_array_equal(np.asarray(shard.data), expected[d * L : (d + 1) * L])
    jaxmg.verify_cyclic(A, out, T_A=T_A)
    np.testing.assert_array_equal(np.asarray(placed), A)  # A is not donated


@pytest.mark.parametrize("T_A", [2, 3])
def test_cyclic_1d_columns_eager_from_the_sharding(T_A):
    ndev = jax.device_count()
    A = numbered(ndev * 5, dtype=np.complex128)
    placed = jax.device_put(A, NamedSharding(mesh_all(), COLS))
    out = jaxmg.cyclic_1d(placed, T_A)  # mesh and in_specs read from A
    np.testing.assert_array_equal(np.asarray(out), reference_layout(A, T_A, ndev, axis=1))
    jaxmg.verify_cyclic(A, out, T_A)  # rows or columns, and ndev, from out's sharding


def test_cyclic_1d_arguments():
    ndev = jax.device_count()
    mesh = mesh_all()
    A = numbered(ndev * 5)
    # pad=False takes a tile that divides the shard, refuses one that does not
    out = jaxmg.cyclic_1d(A, 1, mesh, ROWS, False)
    np.testing.assert_array_equal(np.asarray(out), reference_layout(A, 1, ndev))
    with pytest.raises(ValueError, match="pad=False, but T_A=2 does not divide the 5"):
        jaxmg.cyclic_1d(A, 2, mesh, ROWS, pad=False)
    with pytest.raises(ValueError, match="in_specs must be a single PartitionSpec or a 1-elem"):
        jaxmg.cyclic_1d(A, 2, mesh, (ROWS, ROWS))
    with pytest.raises(TypeError, match="in_specs must be a PartitionSpec or a 1-element"):
        jaxmg.cyclic_1d(A, 2, mesh, 12345)
    with pytest.raises(ValueError, match="sharded over one mesh axis"):
        jaxmg.cyclic_1d(A, 2, mesh, P(None, None))
    with pytest.raises(ValueError, match="square matrix"):
        jaxmg.cyclic_1d(numbered(ndev * 5, ndev * 4), 2, mesh, ROWS)
    with pytest.raises(ValueError, match="pass both mesh and in_specs"):
        jaxmg.cyclic_1d(A, 2, mesh)


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.parametrize(("N", "ndev", "T_A", "table"), HAND_TABLES)
def test_verify_cyclic_accepts_the_layout_and_finds_a_misplaced_row(N, ndev, T_A, table):
    A = numbered(N)
    good = from_table(A.T, table).T  # the rows of A where the hand table puts them
    jaxmg.verify_cyclic(A, good, T_A, ndev=ndev)
    padding = np.flatnonzero(np.array(table).reshape(-1) < 0)
    if padding.size:  # as in 0.0.x, padding rows are not inspected
        junk = good.copy()
        junk[padding] = 99.0
        jaxmg.verify_cyclic(A, junk, T_A, ndev=ndev)
    swapped = good.copy()
    swapped[[0, 1]] = swapped[[1, 0]]
    with pytest.raises(AssertionError, match="row 0 of A is not at row 0 of A_cyclic"):
        jaxmg.verify_cyclic(A, swapped, T_A, ndev=ndev)
    flat = np.array(table).reshape(-1)
    last = np.flatnonzero(flat >= 0)[-1]
    changed = good.copy()
    changed[last, -1] += 1  # every real row is inspected, the last one too
    with pytest.raises(AssertionError, match=f"row {flat[last]} of A is not at row {last} "):
        jaxmg.verify_cyclic(A, changed, T_A, ndev=ndev)
    with pytest.raises(AssertionError, match="got shape"):
        jaxmg.verify_cyclic(A, good[:-1], T_A, ndev=ndev)
    jaxmg.verify_cyclic(A.T, good.T, T_A, ndev=ndev, axis=1)


# --- plot_block_to_cyclic ---------------------------------------------------------------------


@pytest.mark.usefixtures("once_per_suite")
def test_plot_block_to_cyclic_draws_before_and_after():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    N, T_A, ndev = 100, 7, 4  # 0.0.7's test_examples call, argument order N, T_A, ndev
    fig, axs = jaxmg.plot_block_to_cyclic(N, T_A, ndev)
    try:
        assert isinstance(fig, matplotlib.figure.Figure) and axs.shape == (2,)
        before = np.asarray(axs[0].images[0].get_array())
        np.testing.assert_array_equal(before, (np.arange(N) // 25)[None, :])
        # after: device d's block, each column coloured by the device that held it before
        where = reference_layout(np.arange(1, N + 1)[None, :], T_A, ndev, axis=1) - 1
        L = where.shape[1] // ndev  # ceil(25/7)*7 = 28
        where = where.reshape(ndev, L)  # global column at each local column, -1: padding
        after = axs[1].images[0].get_array()
        np.testing.assert_array_equal(np.ma.getmaskarray(after), where < 0)
        np.testing.assert_array_equal(after.data[where >= 0], where[where >= 0] // 25)
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="N_rows must be a positive int"):
        jaxmg.plot_block_to_cyclic(N, T_A, ndev, 0)


@pytest.mark.usefixtures("once_per_suite")
def test_plot_block_to_cyclic_without_matplotlib(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(ImportError, match="needs matplotlib|with matplotlib, which is not"):
        jaxmg.plot_block_to_cyclic(100, 7, 4)


# --- undo_cyclic_1d_layout(a_bc, T_A) (0.0.1) ---------------------------------------------------


@pytest.mark.parametrize(("spec", "axis"), [(COLS, 1), (ROWS, 0)])
def test_undo_cyclic_1d_layout_reads_N_as_0_0_1_did(spec, axis):
    """0.0.1's block_cyclic_cpu_test calls ``undo_cyclic_1d_layout(A_bc, T_A)``: N is the
    length of the axis the relayout leaves alone."""
    ndev = jax.device_count()
    A = numbered(ndev * 5)
    sharding = NamedSharding(mesh_all(), spec)
    A_bc = jaxmg.cyclic_1d_layout(jax.device_put(A, sharding), 2)
    np.testing.assert_array_equal(np.asarray(A_bc), reference_layout(A, 2, ndev, axis=axis))
    back = jaxmg.undo_cyclic_1d_layout(jax.device_put(A_bc, sharding), 2)
    np.testing.assert_array_equal(np.asarray(back), A)
    with pytest.raises(ValueError, match="a_bc must be a matrix"):
        jaxmg.undo_cyclic_1d_layout(jax.device_put(np.ones(ndev * 2), NamedSharding(
            mesh_all(), P("x"))), 2)  # fmt: skip
