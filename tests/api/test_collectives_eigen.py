"""``backend="jax"`` on several devices: the eigensolver (Householder tridiagonalisation,
bisection and inverse iteration in XLA's collectives, jaxmg.engines.tridiagonal, with block
Jacobi, jaxmg.engines.jacobi, where it cannot) and the decompositions built on it (svd, polar,
qr, lstsq), against numpy at the suite's device count (2, 3, 4, 8): eigenvalues, residual and
orthogonality on random, clustered, repeated and graded spectra, both forms, few columns per
device, the route each spectrum takes, the failure status, derivatives against JAX's ``eigh``,
``vmap``, and a program exported for TPU that holds no jaxmg target.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from matrices import DTYPES, FORMS, put, random, several_devices_mesh

import jaxmg
from jaxmg.engines import jacobi, tridiagonal

#: LAPACK's test thresholds: residual and orthogonality in units of ``N eps`` (``||A||_F``).
BOUND = 30.0


@pytest.fixture
def mesh():
    return several_devices_mesh()


def hermitian(n, dtype=np.float64, seed=0):
    m = random(n, dtype, seed)
    return (m + m.conj().T) / 2


def with_spectrum(w, seed=0):
    """``Q diag(w) Q^T`` with a random orthogonal ``Q``."""
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((len(w), len(w))))
    a = (q * w) @ q.T
    return (a + a.T) / 2


def check_pairs(a, w, v):
    """Eigenvalues against numpy's, and LAPACK's scaled residual and orthogonality."""
    n = a.shape[0]
    eps = np.finfo(a.dtype).eps
    w, v = np.asarray(w), np.asarray(v)
    reference = np.linalg.eigvalsh(a.astype(np.complex128 if a.dtype.kind == "c" else np.float64))
    norm = np.linalg.norm(a)
    np.testing.assert_allclose(w, reference, atol=BOUND * n * eps * norm)
    assert np.all(np.diff(w) >= 0)
    assert np.linalg.norm(a @ v - v * w) / (norm * n * eps) < BOUND
    assert np.linalg.norm(v.conj().T @ v - np.eye(n)) / (n * eps) < BOUND


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", FORMS)
def test_syevd_against_numpy(mesh, dtype, form):
    n = 8 * mesh.size
    a = hermitian(n, dtype, seed=1)
    upper_garbage = np.tril(a) + np.triu(random(n, dtype, seed=2), 1)  # only one triangle is read
    if form == "rows":  # rows read the upper triangle (the solver sees conj(A))
        upper_garbage = np.triu(a) + np.tril(random(n, dtype, seed=2), -1)
    w, v = jaxmg.syevd(put(upper_garbage, mesh, FORMS[form]), backend="jax")
    check_pairs(a, w, v)
    values = jaxmg.syevd(put(a, mesh, FORMS[form]), backend="jax", return_eigenvectors=False)
    np.testing.assert_allclose(np.asarray(values), np.asarray(w), rtol=0, atol=1e-5)


def cycle_laplacian(n):
    """The graph Laplacian of an ``n``-cycle: eigenvalues ``2 - 2 cos(2 pi k / n)``, all but two
    of them double."""
    return 2 * np.eye(n) - np.roll(np.eye(n), 1, axis=0) - np.roll(np.eye(n), -1, axis=0)


SPECTRA = {
    # eight copies of each of n / 8 values (multiplicities of 8)
    "repeated": lambda n: with_spectrum(np.repeat(np.arange(n // 8, dtype=float), 8), seed=3),
    # I plus rank 2: one eigenvalue n - 2 times
    "identity plus low rank": lambda n: with_spectrum(
        np.concatenate([np.ones(n - 2), [5.0, -3.0]]), seed=3
    ),
    # half +1, half -1
    "two values": lambda n: with_spectrum(np.where(np.arange(n) % 2, 1.0, -1.0), seed=3),
    # condition 1e12, signs mixed
    "graded": lambda n: with_spectrum(
        np.logspace(0, -12, n) * np.where(np.arange(n) % 3, 1, -1), seed=3
    ),
    # geometric from 1 to 1e-12: the small ones closer than 100 eps ||A|| to each other
    "geometric": lambda n: with_spectrum(np.logspace(0, -12, n), seed=3),
    # tight clusters of four around well separated centres
    "clustered": lambda n: with_spectrum(
        np.repeat(np.arange(n // 4, dtype=float), 4) + 1e-10 * np.tile(np.arange(4), n // 4),
        seed=3,
    ),
    "cycle graph Laplacian": cycle_laplacian,
}


@pytest.fixture
def without_fallback(monkeypatch):
    """Block Jacobi, the tridiagonal route's fallback, made to return NaN and status -1: a
    result that passes took the tridiagonal route."""

    def nan(a, position, layout, *, vectors, axis, ndev):
        real = jnp.finfo(a.dtype).dtype
        return (
            jnp.full_like(a, jnp.nan),
            jnp.full(a.shape[1], jnp.nan, real),
            jnp.full((1,), -1, jnp.int32),
        )

    monkeypatch.setattr(jacobi, "syevd", nan)


#: The spectra every device count runs: clusters that cross the devices' ranges (repeated), T
#: split into 2x2 blocks (two values), several Newton-Schulz steps (geometric). The others take
#: the same paths and run with 4 devices.
EVERYWHERE = ("repeated", "two values", "geometric")


@pytest.mark.parametrize(
    "spectrum",
    [s if s in EVERYWHERE else pytest.param(s, marks=pytest.mark.grid_sweep) for s in SPECTRA],
)
def test_clustered_and_repeated_eigenvalues_keep_orthonormal_vectors(
    mesh, spectrum, without_fallback
):
    n = 16 * mesh.size
    a = SPECTRA[spectrum](n)
    w, v = jax.jit(lambda a: jaxmg.syevd(a, backend="jax"))(put(a, mesh, FORMS["cols"]))
    check_pairs(a, w, v)


def test_matrices_near_overflow_and_underflow(mesh, without_fallback):
    """``A`` times 1e300 and 1e-300: the engine scales ``A`` by a power of two first, so the
    eigenvalues scale and the eigenvectors do not change."""
    n = 8 * mesh.size
    a = hermitian(n, seed=10)
    for scale in (1e300, 1e-300):
        w, v = jaxmg.syevd(put(a * scale, mesh, FORMS["cols"]), backend="jax")
        check_pairs(a, np.asarray(w) / scale, v)


def test_block_jacobi_where_a_cluster_is_wider_than_the_window(mesh, monkeypatch):
    """With no room for clusters (a window of 0) every spectrum with a cluster takes block
    Jacobi, which gives the same eigenpairs."""
    monkeypatch.setattr(tridiagonal, "WINDOW", 0)
    n = 12 * mesh.size
    a = with_spectrum(np.repeat(np.arange(n // 4, dtype=float), 4), seed=9)
    w, v, status = jaxmg.syevd(put(a, mesh, FORMS["rows"]), backend="jax", return_status=True)
    assert int(status) == 0
    check_pairs(a, w, v)


@pytest.mark.parametrize("T_A", [None, 1])
def test_an_odd_number_of_columns_per_device(mesh, T_A):
    """Five columns per device, fewer than the window of positions a device adds on either
    side; with ``T_A=1`` the columns are block-cyclic."""
    n = 5 * mesh.size
    a = hermitian(n, seed=4)
    w, v = jaxmg.syevd(put(a, mesh, FORMS["rows"]), T_A, backend="jax")
    check_pairs(a, w, v)


def test_a_matrix_that_is_not_finite_gives_a_status_and_nan(mesh):
    n = 8 * mesh.size
    a = hermitian(n, seed=5)
    a[3, 3] = np.nan
    w, v, status = jaxmg.syevd(put(a, mesh, FORMS["cols"]), backend="jax", return_status=True)
    assert int(status) == n + 1
    assert np.all(np.isnan(np.asarray(w))) and np.all(np.isnan(np.asarray(v)))


def test_derivatives_against_jax(mesh):
    n = 8 * mesh.size
    a = hermitian(n, seed=6)

    def ours(a):
        w, v = jaxmg.syevd(a, backend="jax")
        return jnp.sum(jnp.sin(w)) + jnp.sum(v[:, 0] ** 2 * jnp.arange(n, dtype=jnp.float64))

    def theirs(a):
        w, v = jnp.linalg.eigh((a + a.T) / 2)
        return jnp.sum(jnp.sin(w)) + jnp.sum(v[:, 0] ** 2 * jnp.arange(n, dtype=jnp.float64))

    with jax.set_mesh(mesh):
        got = jax.jit(jax.grad(ours))(put(a, mesh, FORMS["rows"]))
    want = jax.grad(theirs)(jnp.asarray(a))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-7, atol=1e-9)


def test_vmap_solves_a_batch_as_one_program(mesh):
    n = 8 * mesh.size
    a = np.stack([hermitian(n, seed=s) for s in range(2)])
    eig = jax.vmap(lambda a: jaxmg.syevd(a, mesh=mesh, in_specs=P(None, "x"), backend="jax"))
    w, v = jax.jit(eig)(put(a, mesh, P(None, None, "x")))
    for i in range(2):
        check_pairs(a[i], w[i], v[i])


def test_decompositions_on_the_engine_against_numpy(mesh):
    """svd, polar, qr and lstsq of a square float64 matrix on backend "jax" (QDWH and the
    eigensolver, CholeskyQR with the engine's triangular factor)."""
    n = 8 * mesh.size
    a = random(n, seed=7)
    x = put(a, mesh, FORMS["cols"])
    eps = np.finfo(np.float64).eps
    u, s, vh = (np.asarray(m) for m in jaxmg.svd(x, backend="jax"))
    np.testing.assert_allclose(s, np.linalg.svd(a, compute_uv=False), atol=BOUND * n * eps * s[0])
    assert np.linalg.norm((u * s) @ vh - a) / (np.linalg.norm(a) * n * eps) < BOUND
    up, h = (np.asarray(m) for m in jaxmg.polar(x, backend="jax"))
    assert np.linalg.norm(up @ h - a) / (np.linalg.norm(a) * n * eps) < BOUND
    assert np.linalg.norm(up.T @ up - np.eye(n)) / (n * eps) < BOUND
    q, r = (np.asarray(m) for m in jaxmg.qr(x, backend="jax"))
    assert np.linalg.norm(q @ r - a) / (np.linalg.norm(a) * n * eps) < BOUND
    assert np.array_equal(r, np.triu(r))
    b = random(n, seed=8, cols=2)
    solution = np.asarray(jaxmg.lstsq(x, put(b, mesh, P()), backend="jax")[0])
    np.testing.assert_allclose(solution, np.linalg.solve(a, b), rtol=1e-8, atol=1e-10)


def test_exported_for_tpu_with_no_jaxmg_target(mesh):
    n = 8 * mesh.size
    a = put(hermitian(n), mesh, FORMS["rows"])

    def decompositions(a):
        return jaxmg.syevd(a, backend="jax"), jaxmg.svd(a, backend="jax")

    text = jax.export.export(jax.jit(decompositions), platforms=("tpu",))(a).mlir_module()
    assert "collective_permute" in text  # the rounds' exchanges are there
    targets = set(re.findall(r"custom_call @(\w+)", text))
    assert not {t for t in targets if "jaxmg" in t.lower()}, targets
