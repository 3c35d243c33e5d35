"""NetKet 3.23.0's jaxmg solvers against NetKet's own dense solvers, with NetKet unchanged.

NetKet 3.23 calls jaxmg 1.x's API: ``jaxmg.potrs_shardmap_ctx(A, b, T_A=tile)`` in
``cholesky_distributed`` and ``jaxmg.syevd_shardmap_ctx(A, T_A=tile)`` in
``pinv_smooth_distributed``, on global arrays, eagerly or under the caller's ``jit``, with no
mesh or specs: jaxmg reads them off ``A``, or off the context mesh where ``A``'s sharding is not
visible. Each case is checked against the dense solver (``cholesky``, ``pinv_smooth``): eagerly
and under ``jit``; on NetKet's mesh with Auto axes (its default) and on one with Explicit
axes; ``process_grid`` None, ``(n, 1)`` and ``(1, n)`` (NetKet's dedicated 2D mesh); ``A``
sharded by rows, by columns or replicated. A matrix that is not positive definite goes through
``nan_fallback`` (jaxmg's NaN is what triggers it), and a short VMC_SR run follows the one with
the dense solver. Errors are scaled by ``n * eps * cond(A)``.
"""

import jax
import jax.numpy as jnp
import netket as nk
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from netket_common import (
    VARIANTS,
    VMC_SOLVERS,
    assert_close,
    check_vmc_follows_dense,
    configured,
    solve,
    vector,
    with_spectrum,
)

solvers = nk.optimizer.solver

PAIRS = {
    "cholesky": (solvers.cholesky_distributed, solvers.cholesky),
    "pinv_smooth": (solvers.pinv_smooth_distributed, solvers.pinv_smooth),
}
PLACEMENTS = {"replicated": P(), "rows": P("S", None), "cols": P(None, "S")}
GRIDS = {"default": None, "rows": "n1", "cols": "1n"}
AXES = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}


def process_grid(name):
    n = jax.device_count()
    return {None: None, "n1": (n, 1), "1n": (1, n)}[GRIDS[name]]


def netket_like_mesh(axis_type):
    """NetKet's mesh (all devices on one axis "S", in ``jax.devices()`` order), with the axis
    type NetKet's ``NETKET_EXPERIMENTAL_SHARDING_EXPLICIT`` would give it."""
    return jax.sharding.Mesh(np.asarray(jax.devices()), ("S",), axis_types=(axis_type,))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("pair", PAIRS)
def test_solver_matches_dense(pair, axes, grid, placement, jit):
    n = 48
    dtype = np.float64
    distributed, dense = PAIRS[pair]
    a_host, _ = with_spectrum(np.linspace(1.0, 10.0, n), dtype)
    b_host = vector(n, dtype)
    mesh = netket_like_mesh(AXES[axes])
    with jax.set_mesh(mesh):
        x_ref = solve(dense, jnp.asarray(a_host), jnp.asarray(b_host), jit=False)
        assert_close(x_ref, np.linalg.solve(a_host, b_host), n, dtype, cond=10.0)
        solver = configured(distributed, process_grid=process_grid(grid))
        a = jax.device_put(a_host, NamedSharding(mesh, PLACEMENTS[placement]))
        x = solve(solver, a, jnp.asarray(b_host), jit)
    assert x.shape == (n,) and x.dtype == dtype
    assert_close(x, x_ref, n, dtype, cond=10.0)
    assert not a.is_deleted()  # NetKet needs A after the solve (nan_fallback)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("tile", [None, 4])
@pytest.mark.parametrize("pair", PAIRS)
def test_complex_and_tiles(pair, tile, jit):
    """complex128, NetKet's default tile and one smaller than a device's rows."""
    n = 48
    dtype = np.complex128
    distributed, dense = PAIRS[pair]
    a_host, _ = with_spectrum(np.linspace(1.0, 10.0, n), dtype, seed=6)
    b_host = vector(n, dtype, seed=7)
    x_ref = solve(dense, jnp.asarray(a_host), jnp.asarray(b_host), jit=False)
    solver = configured(distributed, local_tile_size=tile)
    x = solve(solver, jnp.asarray(a_host), jnp.asarray(b_host), jit)
    assert x.dtype == dtype
    assert_close(x, x_ref, n, dtype, cond=10.0)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_nan_fallback_on_a_matrix_that_is_not_positive_definite(jit):
    """``nan_fallback(cholesky_distributed, pinv_smooth)``: jaxmg returns NaN for an indefinite
    ``A`` (one negative eigenvalue), NetKet falls back to the pseudo-inverse and says so; for a
    positive definite ``A`` it does not."""
    n = 48
    spectrum = np.linspace(1.0, 10.0, n)
    spectrum[3] = -2.0
    a_host, _ = with_spectrum(spectrum, np.float64, seed=8)
    b_host = vector(n, np.float64, seed=9)
    solver = solvers.nan_fallback(solvers.cholesky_distributed, solvers.pinv_smooth(rtol=1e-12))
    run = jax.jit(solver) if jit else solver
    x, info = run(jnp.asarray(a_host), jnp.asarray(b_host))
    assert bool(info["solver_fallback"])
    assert_close(x, np.linalg.solve(a_host, b_host), n, np.float64, cond=10.0)
    good, _ = with_spectrum(np.abs(spectrum), np.float64, seed=8)
    x, info = run(jnp.asarray(good), jnp.asarray(b_host))
    assert not bool(info["solver_fallback"])
    assert_close(x, np.linalg.solve(good, b_host), n, np.float64, cond=10.0)


def test_a_true_2d_grid_needs_one_process_per_device():
    """``process_grid=(2, n/2)`` in one process: cuSOLVERMp's 2D grid is one process per GPU
    (as in jaxmg 1.x); jaxmg says so rather than computing elsewhere."""
    if jax.device_count() < 4:
        pytest.skip("a 2D grid needs at least 4 devices")
    a_host, _ = with_spectrum(np.linspace(1.0, 10.0, 48), np.float64)
    solver = solvers.cholesky_distributed(process_grid=(2, jax.device_count() // 2))
    with pytest.raises(ValueError, match="one process per device"):
        solver(jnp.asarray(a_host), jnp.ones(48))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", VMC_SOLVERS)
def test_vmc_sr_follows_dense_solver(name, variant):
    check_vmc_follows_dense(name, variant)
