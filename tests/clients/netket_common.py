"""What the client tests share: matrices with a chosen spectrum, error bounds, NetKet's solvers
called as its SR code calls them, and a short VMC_SR run (the same in NetKet 3.22 and 3.23)."""

import functools

import jax
import netket as nk
import numpy as np
import optax

solvers = nk.optimizer.solver

BOUND = 30.0


def eps(dtype):
    return np.finfo(dtype).eps


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


def check_vmc_follows_dense(name, variant):
    """A VMC_SR run with a distributed solver follows the one with its dense twin."""
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
