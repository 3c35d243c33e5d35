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

import functools

import jax
import jax.numpy as jnp
import netket as nk
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree
from jax.sharding import NamedSharding, PartitionSpec as P

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
BOUND = 30.0


def eps(dtype):
    return np.finfo(dtype).eps


def netket_mesh():
    """The mesh NetKet installed when it was imported: all devices on one axis "S"."""
    return jax.sharding.get_mesh()


def with_spectrum(eigenvalues, dtype, seed=0):
    """A Hermitian ``Q diag(eigenvalues) Q^H`` with a random unitary ``Q``; returns (A, Q)."""
    n = len(eigenvalues)
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        m = m + 1j * rng.standard_normal((n, n))
    q, _ = np.linalg.qr(m)
    a = (q * eigenvalues) @ q.conj().T
    return ((a + a.conj().T) / 2).astype(dtype), q


def vector(n, dtype, seed=1):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(n)
    if np.dtype(dtype).kind == "c":
        v = v + 1j * rng.standard_normal(n)
    return v.astype(dtype)


def place(a_host, placement):
    """A on NetKet's mesh: a plain array (NetKet's mesh makes it replicated) or row-sharded."""
    spec = PLACEMENTS[placement]
    if spec is None:
        return jnp.asarray(a_host)
    return jax.device_put(a_host, NamedSharding(netket_mesh(), spec))


def configured(solver, **kwargs):
    """``solver`` as a NetKet user passes it: bare, or the partial its keyword call returns."""
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    return solver(**kwargs) if kwargs else solver


def solve(solver, a, b, jit):
    fn = jax.jit(solver) if jit else solver
    x, _info = fn(a, b)
    return x


def rel_err(x, x_ref):
    x, x_ref = np.asarray(x), np.asarray(x_ref)
    return np.linalg.norm(x - x_ref) / np.linalg.norm(x_ref)


def assert_close(x, x_ref, n, dtype, cond):
    err = rel_err(x, x_ref) / (n * eps(dtype) * cond)
    assert err < BOUND, err


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


# VMC_SR: an Ising chain of 6 spins and an RBM with alpha=1 (48 real parameters), 64 samples
# from 16 Metropolis chains, 5 steps. SR solves 48 x 48 systems, minSR 64 x 64 ones (real mode).
VARIANTS = {
    "sr": dict(use_ntk=False, on_the_fly=False),
    "minsr": dict(use_ntk=True, on_the_fly=False),
    "minsr-onthefly": dict(use_ntk=True, on_the_fly=True),
}
VMC_SOLVERS = {
    "cholesky_distributed": (solvers.cholesky_distributed, "cholesky"),
    "cholesky_distributed-T8": (solvers.cholesky_distributed(local_tile_size=8), "cholesky"),
    "pinv_smooth_distributed": (solvers.pinv_smooth_distributed, "pinv_smooth"),
}
VMC_STEPS = 5
# The runs differ only by the rounding of each step's solve: NetKet's dense cholesky and
# pinv_smooth give the same parameters to about 1e-14 here, while solving with A + 1e-6 I in
# place of A moves them by about 1e-4.
VMC_RTOL = 1e-10


def vmc_run(linear_solver, variant):
    """Parameters and energies after VMC_STEPS of VMC_SR from fixed parameters and samples."""
    hilbert = nk.hilbert.Spin(0.5, N=6)
    hamiltonian = nk.operator.IsingJax(hilbert, nk.graph.Chain(6, pbc=True), h=1.0)
    state = nk.vqs.MCState(
        nk.sampler.MetropolisLocal(hilbert, n_chains=16),
        nk.models.RBM(alpha=1, param_dtype=np.float64),
        n_samples=64,
        n_discard_per_chain=4,
        seed=1,
        sampler_seed=2,
    )
    initial = state.parameters
    driver = nk.driver.VMC_SR(
        hamiltonian,
        optax.sgd(0.05),
        variational_state=state,
        diag_shift=0.01,
        linear_solver=linear_solver,
        **VARIANTS[variant],
    )
    log = nk.logging.RuntimeLog()
    driver.run(VMC_STEPS, out=log, show_progress=False)
    energies = np.asarray(log.data["Energy"]["Mean"])
    assert energies.shape == (VMC_STEPS,)
    return initial, state.parameters, energies


@functools.cache
def dense_vmc_run(dense_name, variant):
    return vmc_run(getattr(solvers, dense_name), variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", VMC_SOLVERS)
def test_vmc_sr_follows_dense_solver(name, variant):
    linear_solver, dense_name = VMC_SOLVERS[name]
    initial, params_ref, energies_ref = dense_vmc_run(dense_name, variant)
    moved = max(
        float(np.abs(p - q).max())
        for p, q in zip(*map(jax.tree.leaves, (params_ref, initial)), strict=True)
    )
    assert moved > 1e-3  # the reference run really optimised something

    _, params, energies = vmc_run(linear_solver, variant)
    np.testing.assert_allclose(energies, energies_ref, rtol=VMC_RTOL)
    assert jax.tree.structure(params) == jax.tree.structure(params_ref)
    for leaf, ref in zip(jax.tree.leaves(params), jax.tree.leaves(params_ref), strict=True):
        np.testing.assert_allclose(leaf, ref, rtol=VMC_RTOL, atol=VMC_RTOL * np.abs(ref).max())
