"""jaxmg.svd / polar / lstsq / qr against numpy and scipy on every simulated device count.

The references share no code with jaxmg: numpy's LAPACK SVD, QR and least squares, scipy's
polar decomposition; derivatives against JAX's own rules for ``jnp.linalg`` on the gathered
matrix (one device) and against central finite differences.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxmg

SWEPT = pytest.mark.dtype_sweep
DTYPES = [
    pytest.param(np.float32, marks=SWEPT),
    np.float64,
    pytest.param(np.complex64, marks=SWEPT),
    np.complex128,
]
FORMS = {"rows": P("x", None), "cols": P(None, "x")}


def mesh_of_all():
    return jax.make_mesh((jax.device_count(),), ("x",))


# Sharding forms by shape: both forms of a square A, and the mixed cases of a rectangular one
# (a tall A by columns, a wide A by rows: U and V sharded along different dimensions).
CASES = [("square", "rows"), ("square", "cols"), ("tall", "cols"), ("wide", "rows")]


def shapes():
    """Square, tall and wide, each sharded dimension a multiple of the device count."""
    d = jax.device_count()
    return {"square": (2 * d, 2 * d), "tall": (3 * d, d), "wide": (d, 3 * d)}


def matrix(shape, dtype, seed=0, cond=None):
    """A random matrix; with ``cond``, singular values spread geometrically from 1 to 1/cond."""
    rng = np.random.default_rng(seed)
    complex_ = np.dtype(dtype).kind == "c"

    def normal(*s):
        return rng.standard_normal(s) + (1j * rng.standard_normal(s) if complex_ else 0)

    a = normal(*shape)
    if cond is not None:
        m, n = shape
        k = min(m, n)
        u, _ = np.linalg.qr(normal(m, k))
        v, _ = np.linalg.qr(normal(n, k))
        a = (u * np.logspace(0, -np.log10(cond), k)) @ v.conj().T
    return a.astype(dtype)


def put(a, spec):
    return jax.device_put(a, NamedSharding(mesh_of_all(), spec))


def tol(dtype, factor=50):
    return factor * np.finfo(dtype).eps


def unit(dtype):
    return np.finfo(dtype).eps


def orthonormality(q):
    q = np.asarray(q, dtype=np.complex128)
    return np.abs(q.conj().T @ q - np.eye(q.shape[1])).max()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("kind", "form"), CASES)
def test_svd_against_numpy(kind, form, dtype):
    shape = shapes()[kind]
    a = matrix(shape, dtype)
    u, s, vh, status = jaxmg.svd(put(a, FORMS[form]), return_status=True)
    k = min(shape)
    assert (u.shape, s.shape, vh.shape) == ((shape[0], k), (k,), (k, shape[1]))
    assert int(status) == 0
    s_ref = np.linalg.svd(a, compute_uv=False)
    scale = s_ref[0]
    np.testing.assert_allclose(np.asarray(s), s_ref, atol=tol(dtype) * scale * max(shape))
    u, vh = np.asarray(u), np.asarray(vh)
    rebuilt = (u * np.asarray(s)) @ vh
    assert np.abs(rebuilt - a).max() <= tol(dtype) * scale * max(shape)
    assert orthonormality(u) <= tol(dtype) * max(shape)
    assert orthonormality(vh.conj().T) <= tol(dtype) * max(shape)
    if form == "rows" and shape[0] % jax.device_count() == 0:
        assert jaxmg.svd(put(a, FORMS[form]))[0].sharding.spec == FORMS[form]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", ["tall", "wide"])
def test_svd_full_matrices_and_values_only(kind, form):
    shape = shapes()[kind]
    a = matrix(shape, np.float64, seed=1)
    A = put(a, FORMS[form])
    u, s, vh = jaxmg.svd(A, full_matrices=True)
    assert u.shape == (shape[0], shape[0]) and vh.shape == (shape[1], shape[1])
    assert orthonormality(u) <= 1e-13 and orthonormality(np.asarray(vh).T) <= 1e-13
    sigma = np.zeros(shape)
    np.fill_diagonal(sigma, np.asarray(s))
    np.testing.assert_allclose(np.asarray(u) @ sigma @ np.asarray(vh), a, atol=1e-13)
    np.testing.assert_allclose(
        np.asarray(jaxmg.svd(A, compute_uv=False)), np.linalg.svd(a, compute_uv=False), rtol=1e-13
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("kind", "form"), CASES)
def test_qr_against_numpy(kind, form, dtype):
    shape = shapes()[kind]
    a = matrix(shape, dtype, seed=2)
    q, r = jaxmg.qr(put(a, FORMS[form]))
    q, r = np.asarray(q), np.asarray(r)
    k = min(shape)
    assert q.shape == (shape[0], k) and r.shape == (k, shape[1])
    assert np.all(np.tril(r, -1) == 0)
    norm = np.linalg.norm(a, 2)
    assert np.abs(q @ r - a).max() <= tol(dtype) * norm * max(shape)
    assert orthonormality(q) <= tol(dtype) * max(shape)
    # numpy's R, up to the signs (phases) of its diagonal: R = D R_numpy with |D| = I.
    r_ref = np.linalg.qr(a, mode="r")
    phases = np.diag(r_ref) / np.abs(np.diag(r_ref))
    np.testing.assert_allclose(
        r, np.conj(phases)[:, None] * r_ref, atol=tol(dtype) * norm * max(shape)
    )
    # The same R from the program without Q, to rounding: the two programs are compiled apart
    # (XLA:CPU's elemental emitters round one element of the wide complex case 1 ulp apart).
    r_only = np.asarray(jaxmg.qr(put(a, FORMS[form]), mode="r"))
    np.testing.assert_allclose(r_only, r, rtol=0, atol=8 * np.finfo(dtype).eps * norm)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("side", ["right", "left"])
def test_polar_against_scipy(side, form, dtype):
    shape = shapes()["square" if side == "right" else "tall"]
    a = matrix(shape, dtype, seed=3)
    u, p = jaxmg.polar(put(a, FORMS[form]), side=side)
    u_ref, p_ref = scipy.linalg.polar(a, side=side)
    scale = np.linalg.norm(a, 2) * max(shape)
    np.testing.assert_allclose(np.asarray(u), u_ref, atol=tol(dtype, 200) * max(shape))
    np.testing.assert_allclose(np.asarray(p), p_ref, atol=tol(dtype, 200) * scale)
    assert np.abs(np.asarray(p) - np.asarray(p).conj().T).max() == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("kind", "form"), CASES)
def test_lstsq_against_numpy(kind, form, dtype):
    shape = shapes()[kind]
    a = matrix(shape, dtype, seed=4)
    b = matrix((shape[0], 2), dtype, seed=5)
    x, resid, rank, s = jaxmg.lstsq(put(a, FORMS[form]), jnp.asarray(b))
    x_ref, _, rank_ref, s_ref = np.linalg.lstsq(a, b, rcond=None)
    np.testing.assert_allclose(np.asarray(x), x_ref, atol=tol(dtype, 500) * max(shape))
    assert int(rank) == rank_ref
    np.testing.assert_allclose(np.asarray(s), s_ref, atol=tol(dtype) * s_ref[0] * max(shape))
    residual = np.linalg.norm(b - a @ x_ref, axis=0) ** 2
    np.testing.assert_allclose(np.asarray(resid), residual, atol=tol(dtype, 500) * max(shape))
    x1, resid1, _, _ = jaxmg.lstsq(put(a, FORMS[form]), jnp.asarray(b[:, 0]))
    assert x1.shape == (shape[1],) and resid1.shape == ()
    np.testing.assert_allclose(np.asarray(x1), np.asarray(x)[:, 0], rtol=1e-5)


@pytest.mark.parametrize("form", FORMS)
def test_lstsq_rank_deficient(form):
    """Rank 2 of 2 * ndev columns: numpy's minimum-norm solution, and its rank."""
    m, n = shapes()["tall"][0], shapes()["square"][1]
    m = max(m, n)
    rng = np.random.default_rng(6)
    a = rng.standard_normal((m, 2)) @ rng.standard_normal((2, n))
    b = rng.standard_normal(m)
    x, resid, rank, _ = jaxmg.lstsq(put(a, FORMS[form]), jnp.asarray(b))
    x_ref, _, rank_ref, _ = np.linalg.lstsq(a, b, rcond=None)
    assert int(rank) == rank_ref == 2
    np.testing.assert_allclose(np.asarray(x), x_ref, atol=1e-12)
    np.testing.assert_allclose(float(resid), np.linalg.norm(b - a @ x_ref) ** 2, rtol=1e-10)


@pytest.mark.parametrize("cond", [1e4, 1e8, 1e12])
def test_accuracy_on_ill_conditioned_input(cond):
    """float64, square: singular values to O(ε σ_max) (absolute, as LAPACK), a backward-stable
    reconstruction and orthonormal factors, whatever the condition number."""
    n = shapes()["square"][0]
    a = matrix((n, n), np.float64, seed=7, cond=cond)
    A = put(a, FORMS["rows"])
    u, s, vh = (np.asarray(x) for x in jaxmg.svd(A))
    s_ref = np.linalg.svd(a, compute_uv=False)
    assert np.abs(s - s_ref).max() <= 100 * unit(np.float64)
    assert np.abs((u * s) @ vh - a).max() <= 100 * unit(np.float64)
    assert max(orthonormality(u), orthonormality(vh.T)) <= 100 * unit(np.float64)
    q, r = (np.asarray(x) for x in jaxmg.qr(A))
    assert np.abs(q @ r - a).max() <= 100 * unit(np.float64)
    assert orthonormality(q) <= 100 * unit(np.float64)
    up, p = (np.asarray(x) for x in jaxmg.polar(A))
    assert np.abs(up @ p - a).max() <= 100 * unit(np.float64)
    assert orthonormality(up) <= 100 * unit(np.float64)


def test_qr_of_dependent_columns():
    """Two equal columns: either a factorisation fails (the status names the minor, Q and R
    are NaN) or rounding kept them apart, and then Q R is still A with orthonormal Q (R has a
    diagonal entry at rounding level, as Householder's would), never a wrong factorisation."""
    n = shapes()["square"][0]
    a = matrix((n, n), np.float64, seed=8)
    a[:, 1] = a[:, 0]
    q, r, status = jaxmg.qr(put(a, FORMS["cols"]), return_status=True)
    q, r = np.asarray(q), np.asarray(r)
    if int(status) > 0:
        assert np.isnan(q).all() and np.isnan(r).all()
    else:
        assert np.abs(q @ r - a).max() <= 100 * n * unit(np.float64) * np.linalg.norm(a, 2)
        assert orthonormality(q) <= 100 * n * unit(np.float64)
        assert np.abs(np.diag(r)).min() <= 1e-10 * np.linalg.norm(a, 2)


@pytest.mark.parametrize("form", FORMS)
def test_svd_rank_deficient(form):
    """Rank 2: the singular values (zeros to rounding level, never negative), a backward
    stable reconstruction, and orthonormal vectors for the nonzero singular values."""
    n = shapes()["square"][0]
    rng = np.random.default_rng(20)
    a = rng.standard_normal((n, 2)) @ rng.standard_normal((2, n))
    u, s, vh = (np.asarray(x) for x in jaxmg.svd(put(a, FORMS[form])))
    s_ref = np.linalg.svd(a, compute_uv=False)
    np.testing.assert_allclose(s, s_ref, atol=50 * n * unit(np.float64) * s_ref[0])
    assert (s >= 0).all()
    np.testing.assert_allclose((u * s) @ vh, a, atol=50 * n * unit(np.float64) * s_ref[0])
    assert max(orthonormality(u[:, :2]), orthonormality(vh[:2].T)) <= 100 * unit(np.float64)


# --- one device, backends, and bad input


@pytest.mark.usefixtures("once_per_suite")
def test_one_device_default_is_jax_and_mg_matches():
    """On a one-device axis the default is JAX's own decompositions; backend="mg" runs the
    compositions on the LAPACK twin, with the same results."""
    mesh = jax.make_mesh((1,), ("x",))
    a = matrix((6, 4), np.float64, seed=18)
    A = jax.device_put(a, NamedSharding(mesh, P("x", None)))
    s_ref = np.linalg.svd(a, compute_uv=False)
    for backend in (None, "mg"):
        np.testing.assert_allclose(np.asarray(jaxmg.svd(A, backend=backend)[1]), s_ref, rtol=1e-13)
        q, r = jaxmg.qr(A, backend=backend)
        np.testing.assert_allclose(np.asarray(q) @ np.asarray(r), a, atol=1e-13)


def test_under_jit_on_explicit_axes():
    shape = shapes()["tall"]
    a = matrix(shape, np.float64, seed=19)
    u, s, vh = jax.jit(jaxmg.svd)(put(a, FORMS["rows"]))
    np.testing.assert_allclose((np.asarray(u) * np.asarray(s)) @ np.asarray(vh), a, atol=1e-13)
    q, r = jax.jit(jaxmg.qr)(put(a, FORMS["cols"]))
    np.testing.assert_allclose(np.asarray(q) @ np.asarray(r), a, atol=1e-13)


@pytest.mark.usefixtures("once_per_suite")
def test_bad_input_is_refused_before_device_work():
    A = put(matrix(shapes()["square"], np.float64), FORMS["rows"])
    with pytest.raises(ValueError, match="side must be 'right' or 'left'"):
        jaxmg.polar(A, side="up")
    with pytest.raises(ValueError, match="mode must be 'reduced' or 'r'"):
        jaxmg.qr(A, mode="complete")
    with pytest.raises(ValueError, match=r"b must have shape \[\d+\] or \[\d+, nrhs\].*rows of A"):
        jaxmg.lstsq(A, jnp.ones(A.shape[0] + 1))
    with pytest.raises(TypeError, match="b has dtype float32"):
        jaxmg.lstsq(A, jnp.ones(A.shape[0], jnp.float32))
    with pytest.raises(TypeError, match="dtype int32"):
        jaxmg.svd(jnp.ones((4, 4), jnp.int32))
    with pytest.raises(ValueError, match="must be 2-D"):
        jaxmg.qr(jnp.ones(4))
    with pytest.raises(ValueError, match="does not divide"):
        jaxmg.svd(
            put(matrix((jax.device_count() + 1, 2), np.float64), P(None, None)),
            in_specs=P("x", None),
        )
