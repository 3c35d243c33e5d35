"""NetKet 3.22.4's jaxmg solvers against NetKet's own dense solvers, with NetKet unchanged.

``netket.optimizer.solver.cholesky_distributed`` (jaxmg.potrs) is checked against
``netket.optimizer.solver.cholesky`` and ``pinv_smooth_distributed`` (jaxmg.syevd) against
``pinv_smooth``, called as NetKet's SR code calls them: eagerly and under jit, with A replicated
(a plain array under NetKet's mesh) or sharded by rows ``P("S", None)``, the default tile size
and others, b a vector or a pytree. Errors are scaled by ``n * eps * cond(A)``.

A short VMC_SR run (Ising chain, RBM) with each distributed solver must follow the run with the
dense solver from the same parameters and samples, for SR (``use_ntk=False``, an
n_parameters-sized matrix) and minSR (``use_ntk=True``, n_samples-sized, with and without
``on_the_fly``).
"""

import jax
import jax.numpy as jnp
import netket as nk
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from jax.sharding import NamedSharding, PartitionSpec as P
from netket_common import (
    BOUND,
    VARIANTS,
    VMC_SOLVERS,
    assert_close,
    check_vmc_follows_dense,
    configured,
    eps,
    solve,
    vector,
    with_spectrum,
)

solvers = nk.optimizer.solver

# distributed solver -> the dense NetKet solver it must agree with
PAIRS = {
    "cholesky": (solvers.cholesky_distributed, solvers.cholesky),
    "pinv_smooth": (solvers.pinv_smooth_distributed, solvers.pinv_smooth),
}
DTYPES = [np.float64, np.complex128]
PLACEMENTS = {"replicated": None, "rows": P("S", None)}
# local_tile_size from (N, device count): NetKet's default; 5, which divides no shard of 48
# columns on 1, 2 or 4 devices; one wider than a device's shard (wider than N on 1 device).
TILES = {
    "default": lambda n, ndev: None,
    "T5": lambda n, ndev: 5,
    "shard+4": lambda n, ndev: n // ndev + 4,
}


def netket_mesh():
    """The mesh NetKet installed when it was imported: all devices on one axis "S"."""
    return jax.sharding.get_mesh()


def place(a_host, placement):
    """A on NetKet's mesh: a plain array (NetKet's mesh makes it replicated) or row-sharded."""
    spec = PLACEMENTS[placement]
    if spec is None:
        return jnp.asarray(a_host)
    return jax.device_put(a_host, NamedSharding(netket_mesh(), spec))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("pair", PAIRS)
def test_solver_matches_dense(pair, tile, dtype, placement, jit):
    """A Hermitian positive definite A (eigenvalues 1..10) and a vector b."""
    n = 48
    distributed, dense = PAIRS[pair]
    a_host, _ = with_spectrum(np.linspace(1.0, 10.0, n), dtype)
    b_host = vector(n, dtype)
    x_ref = solve(dense, jnp.asarray(a_host), jnp.asarray(b_host), jit=False)
    assert_close(x_ref, np.linalg.solve(a_host, b_host), n, dtype, cond=10.0)

    local_tile_size = TILES[tile](n, jax.device_count())
    solver = configured(distributed, local_tile_size=local_tile_size)
    x = solve(solver, place(a_host, placement), jnp.asarray(b_host), jit)
    assert x.shape == (n,) and x.dtype == dtype
    assert_close(x, x_ref, n, dtype, cond=10.0)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pair", PAIRS)
def test_pytree_rhs_round_trips(pair, dtype, placement, jit):
    """b a pytree, as the parameters' gradient is: NetKet ravels it for the solve and unravels
    the solution, which must come back with b's structure, shapes and dtypes."""
    distributed, dense = PAIRS[pair]
    n = 48
    a_host, _ = with_spectrum(np.linspace(1.0, 10.0, n), dtype, seed=2)
    flat = vector(n, dtype, seed=3)
    b = {
        "kernel": jnp.asarray(flat[: n // 2].reshape(n // 4, 2)),
        "bias": jnp.asarray(flat[n // 2 :]),
    }
    x_ref = solve(dense, jnp.asarray(a_host), b, jit=False)
    x = solve(distributed, place(a_host, placement), b, jit)

    assert jax.tree.structure(x) == jax.tree.structure(b)
    for leaf, like in zip(jax.tree.leaves(x), jax.tree.leaves(b), strict=True):
        assert leaf.shape == like.shape and leaf.dtype == like.dtype
    assert_close(ravel_pytree(x)[0], ravel_pytree(x_ref)[0], n, dtype, cond=10.0)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", ["default", "T5"])
def test_pinv_smooth_distributed_cuts_the_null_space(tile, dtype, placement, jit):
    """A singular positive semidefinite A (half its eigenvalues 1..10, half zero) and a b with
    a component in A's null space: rtol=1e-8 sits between the zero eigenvalues (rounding, below
    1e-15 relative) and the rest (at least 0.1 relative), so both solvers return the
    pseudo-inverse solution, with nothing in the null space (without the cut, x would be about
    1e16 times longer)."""
    n = 48
    rank = n // 2
    spectrum = np.concatenate([np.linspace(1.0, 10.0, rank), np.zeros(n - rank)])
    a_host, q = with_spectrum(spectrum, dtype, seed=4)
    b_host = vector(n, dtype, seed=5)
    rtol = 1e-8
    x_ref = solve(solvers.pinv_smooth(rtol=rtol), jnp.asarray(a_host), jnp.asarray(b_host), False)
    pinv_numpy = np.linalg.pinv(a_host, rtol=rtol, hermitian=True) @ b_host
    assert_close(x_ref, pinv_numpy, n, dtype, cond=10.0)

    local_tile_size = TILES[tile](n, jax.device_count())
    solver = configured(solvers.pinv_smooth_distributed, rtol=rtol, local_tile_size=local_tile_size)
    x = solve(solver, place(a_host, placement), jnp.asarray(b_host), jit)
    assert x.shape == (n,) and x.dtype == dtype
    assert_close(x, x_ref, n, dtype, cond=10.0)
    null_part = np.linalg.norm(q[:, rank:].conj().T @ np.asarray(x)) / np.linalg.norm(x)
    assert null_part / (n * eps(dtype)) < BOUND, null_part


def test_netket_runs_on_every_device(request):
    """NetKet's mesh spans this process's simulated devices (the device count is consistent)."""
    count = request.config.getoption("--num-cpu-devices")
    assert jax.device_count() == count
    mesh = netket_mesh()
    assert mesh.axis_names == ("S",) and mesh.size == count
    assert nk.config.netket_experimental_sharding_cpu in (0, count)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", VMC_SOLVERS)
def test_vmc_sr_follows_dense_solver(name, variant):
    check_vmc_follows_dense(name, variant)
