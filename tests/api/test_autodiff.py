"""Derivatives of every jaxmg solver, and the factor objects, on every simulated device count.

Values are checked against numpy, derivatives against finite differences
(``jax.test_util.check_grads``, forward and reverse) and against JAX's own single-device
functions on the same data (``jnp.linalg.solve``, ``slogdet``, ``inv``, ``eigh``). Hermitian
routines are differentiated as functions of ``(S + S^H) / 2``, the meaning jaxmg documents.
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from jax.test_util import check_grads
from matrices import hpd, random

import jaxmg

# The whole grid runs with 4 devices; the other device counts run float64 through the in-place
# relayout (the other dtype and relayouts are the same derivative code, and
# tests/api/test_solvers.py sweeps the solvers themselves on every count).
SWEPT = pytest.mark.grid_sweep
DTYPES = [np.float64, pytest.param(np.complex128, marks=SWEPT)]
FORMS = {"cols": P(None, "x"), "rows": P("x", None)}
# (relayout, T_A) with 4 columns per device: no relayout, and a tile that splits the shards.
ROUTES = [
    pytest.param("native", None, id="whole-shards", marks=SWEPT),
    pytest.param("native", 3, id="native-T3"),
    pytest.param("jax", 3, id="jax-T3", marks=SWEPT),
]


def general(n, dtype, seed=0):
    return (random(n, dtype, seed) + 2 * np.eye(n)).astype(dtype)


def herm(s):
    return (s + jnp.conj(s).T) / 2


@pytest.fixture(scope="module")
def mesh():
    """Auto axes: user code may symmetrise a sharded matrix freely (Explicit axes: below)."""
    return jax.make_mesh((jax.device_count(),), ("x",), axis_types=(AxisType.Auto,))


def put(a, mesh, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def size():
    return 4 * jax.device_count()


# check_grads: finite differences in float64 (every case here is double precision).
GRADS = dict(atol=1e-5, rtol=1e-5, eps=1e-4)


def close(got, want, scale=1.0):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-8, atol=1e-9 * scale)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("relayout", "T_A"), ROUTES)
def test_potrs_and_logdet(mesh, dtype, form, relayout, T_A):
    n = size()
    a0, b0 = hpd(n, dtype), random(n, dtype, 1, cols=2)
    spec = FORMS[form]
    kw = dict(T_A=T_A, mesh=mesh, in_specs=spec, relayout=relayout)

    def solve(s, b):
        return jaxmg.potrs(herm(s), b, return_logdet=True, **kw)

    def reference(s, b):
        h = herm(s)
        return jnp.linalg.solve(h, b), jnp.linalg.slogdet(h)[1]

    a, b = put(a0, mesh, spec), jnp.asarray(b0)
    x, logdet = solve(a, b)
    close(x, np.linalg.solve(a0, b0))
    close(logdet, np.linalg.slogdet(a0)[1], scale=n)
    check_grads(solve, (a, b), order=1, modes=("fwd", "rev"), **GRADS)

    def loss(fn):
        def scalar(s, b):
            x, logdet = fn(s, b)
            return jnp.sum(jnp.abs(x) ** 2) + logdet

        return jax.grad(scalar, argnums=(0, 1))

    got = jax.jit(loss(solve))(a, b)
    want = loss(reference)(jnp.asarray(a0), b)
    for g, w in zip(got, want, strict=True):
        close(g, w)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("form", FORMS)
def test_potrs_second_order(mesh, dtype, form):
    n = size()
    a0, b0 = hpd(n, dtype), random(n, dtype, 1, cols=1)
    spec = FORMS[form]

    def solve(s, b):
        x, logdet = jaxmg.potrs(herm(s), b, return_logdet=True, mesh=mesh, in_specs=spec)
        return jnp.sum(jnp.abs(x) ** 2) + logdet

    check_grads(solve, (put(a0, mesh, spec), jnp.asarray(b0)), order=2, modes=("rev",), **GRADS)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("relayout", "T_A"), ROUTES)
def test_cho_factor_and_solve(mesh, dtype, form, relayout, T_A):
    n = size()
    a0 = hpd(n, dtype)
    spec = FORMS[form]
    kw = dict(T_A=T_A, mesh=mesh, in_specs=spec, relayout=relayout)
    factor = jaxmg.cho_factor(put(a0, mesh, spec), **kw)
    assert int(factor.status) == 0
    close(factor.logdet, np.linalg.slogdet(a0)[1], scale=n)
    # Many right-hand sides over time, one factor: eagerly, and passed into jit.
    solve = jax.jit(jaxmg.cho_solve)
    for seed in range(3):
        b0 = random(n, dtype, 10 + seed, cols=seed + 1)[:, : seed + 1]
        close(solve(factor, jnp.asarray(b0)), np.linalg.solve(a0, b0))
    vector = random(n, dtype, 20, cols=1)[:, 0]
    close(jaxmg.cho_solve(factor, jnp.asarray(vector)), np.linalg.solve(a0, vector))

    def through_factor(s, b):
        f = jaxmg.cho_factor(herm(s), **kw)
        return jaxmg.cho_solve(f, b), f.logdet

    b0 = random(n, dtype, 2, cols=2)
    args = (put(a0, mesh, spec), jnp.asarray(b0))
    check_grads(through_factor, args, order=1, modes=("fwd", "rev"), **GRADS)

    def reference(s, b):
        h = herm(s)
        return jnp.real(jnp.sum(jnp.linalg.solve(h, b))) + jnp.linalg.slogdet(h)[1]

    def scalar(s, b):
        x, logdet = through_factor(s, b)
        return jnp.real(jnp.sum(x)) + logdet

    got = jax.jit(jax.grad(scalar, argnums=(0, 1)))(*args)
    want = jax.grad(reference, argnums=(0, 1))(jnp.asarray(a0), jnp.asarray(b0))
    for g, w in zip(got, want, strict=True):
        close(g, w)


def test_factor_objects_cross_jit_boundaries(mesh):
    n = size()
    a0, b0 = hpd(n, np.float64), random(n, np.float64, 1, cols=3)
    spec = FORMS["cols"]
    factor = jax.jit(lambda a: jaxmg.cho_factor(a, mesh=mesh, in_specs=spec))(put(a0, mesh, spec))
    assert isinstance(factor, jaxmg.CholeskyFactor)
    assert factor.shape == (n, n) and "CholeskyFactor" in repr(factor)
    leaves = jax.tree_util.tree_leaves(factor)
    assert len(leaves) == 3  # factor, matrix, status: the rest is static
    x = jax.jit(lambda f, b: jaxmg.cho_solve(f, b))(factor, jnp.asarray(b0))
    close(x, np.linalg.solve(a0, b0))
    g0 = general(n, np.float64)
    lu = jax.jit(lambda a: jaxmg.lu_factor(a, mesh=mesh, in_specs=spec))(put(g0, mesh, spec))
    assert isinstance(lu, jaxmg.LUFactor) and int(lu.status) == 0
    x = jax.jit(lambda f, b: jaxmg.lu_solve(f, b, trans=1))(lu, jnp.asarray(b0))
    close(x, np.linalg.solve(g0.T, b0))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("trans", [0, 1, 2])
def test_lu_solve(mesh, dtype, form, trans):
    n = size()
    a0, b0 = general(n, dtype), random(n, dtype, 1, cols=2)
    spec = FORMS[form]
    op = [lambda m: m, lambda m: m.T, lambda m: jnp.conj(m).T][trans]

    def solve(s, b):
        return jaxmg.lu_solve(s, b, T_A=3, mesh=mesh, in_specs=spec, trans=trans)

    a = put(a0, mesh, spec)
    x, status = jaxmg.lu_solve(a, jnp.asarray(b0), T_A=3, trans=trans, return_status=True)
    assert int(status) == 0
    close(x, np.linalg.solve(np.asarray(op(a0)), b0))
    check_grads(solve, (a, jnp.asarray(b0)), order=1, modes=("fwd", "rev"), **GRADS)

    def scalar(fn):
        return jax.grad(lambda s, b: jnp.sum(jnp.abs(fn(s, b)) ** 2), argnums=(0, 1))

    got = jax.jit(scalar(solve))(a, jnp.asarray(b0))
    want = scalar(lambda s, b: jnp.linalg.solve(op(s), b))(jnp.asarray(a0), jnp.asarray(b0))
    for g, w in zip(got, want, strict=True):
        close(g, w)


@pytest.mark.parametrize("form", FORMS)
def test_lu_pivots_ill_conditioning_and_singularity(mesh, form):
    n = size()
    spec = FORMS[form]
    rng = np.random.default_rng(3)
    # Pivoting is needed: a zero leading entry, and a row order a plain LU would divide by.
    a0 = rng.standard_normal((n, n))
    a0[0, 0] = 0.0
    b0 = rng.standard_normal((n, 2))
    factor = jaxmg.lu_factor(put(a0, mesh, spec), T_A=3)
    x = jaxmg.lu_solve(factor, jnp.asarray(b0))
    close(x, np.linalg.solve(a0, b0), scale=np.linalg.cond(a0))
    # Ill-conditioned (cond ~ 1e12): the backward error stays at the level of eps.
    u, _, vt = np.linalg.svd(rng.standard_normal((n, n)))
    ill = u @ np.diag(np.logspace(0, -12, n)) @ vt
    x = np.asarray(jaxmg.lu_solve(put(ill, mesh, spec), jnp.asarray(b0), T_A=3))
    residual = np.linalg.norm(ill @ x - b0) / (np.linalg.norm(ill) * np.linalg.norm(x))
    assert residual < 1e3 * np.finfo(np.float64).eps
    # Exactly singular: column 2 is zero; status 3 (LAPACK's 1-based index, of the factor of A
    # whatever the sharding), NaN results.
    singular = a0.copy()
    singular[:, 2] = 0.0
    x, status = jaxmg.lu_solve(put(singular, mesh, spec), jnp.asarray(b0), return_status=True)
    assert int(status) == 3
    assert np.isnan(np.asarray(x)).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("form", FORMS)
def test_potri_derivatives(mesh, dtype, form):
    n = size()
    a0 = hpd(n, dtype)
    spec = FORMS[form]
    weights = jnp.asarray(random(n, dtype, 5))

    def inverse(s):
        return jaxmg.potri(herm(s), T_A=3, mesh=mesh, in_specs=spec)

    a = put(a0, mesh, spec)
    check_grads(inverse, (a,), order=1, modes=("fwd", "rev"), **GRADS)

    def scalar(fn):
        return jax.grad(lambda s: jnp.real(jnp.sum(fn(s) * weights)))

    close(jax.jit(scalar(inverse))(a), scalar(lambda s: jnp.linalg.inv(herm(s)))(jnp.asarray(a0)))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("form", FORMS)
def test_syevd_derivatives(mesh, dtype, form):
    n = size()
    a0 = (random(n, dtype, 4) + np.diag(np.arange(n))).astype(dtype)  # well-separated spectrum
    spec = FORMS[form]
    weights = jnp.asarray(np.random.default_rng(6).standard_normal((n, n)))

    def invariant(eigh):
        """Values and the phase-invariant |V|^2: what finite differences can check."""

        def fn(s):
            w, v = eigh(herm(s))
            return w, jnp.abs(v) ** 2 * weights

        return fn

    solver = invariant(lambda h: jaxmg.syevd(h, T_A=3, mesh=mesh, in_specs=spec))
    a = put(a0, mesh, spec)
    check_grads(solver, (a,), order=1, modes=("fwd", "rev"), **GRADS)

    def values_only(s):
        return jaxmg.syevd(herm(s), mesh=mesh, in_specs=spec, return_eigenvectors=False)

    check_grads(values_only, (a,), order=1, modes=("fwd", "rev"), **GRADS)

    def scalar(fn):
        return jax.grad(lambda s: sum(jnp.sum(o) for o in fn(s)))

    reference = invariant(jnp.linalg.eigh)
    close(jax.jit(scalar(solver))(a), scalar(reference)(jnp.asarray(a0)))


@pytest.mark.parametrize("form", FORMS)
def test_backward_reuses_the_factor(mesh, form):
    """The compiled gradient program factors once (the forward potrs, which also returns its
    factor) and solves the adjoint with that factor. Counted in the native engine's calls (on
    one device too: tests/api/test_dense.py counts JAX's own)."""
    n = size()
    spec = FORMS[form]
    a, b = put(hpd(n, np.float64), mesh, spec), jnp.asarray(random(n, np.float64, 1, cols=1))
    native = dict(mesh=mesh, in_specs=spec, backend="mg")

    def loss(s, b):
        x, logdet = jaxmg.potrs(s, b, return_logdet=True, **native)
        return jnp.sum(x**2) + logdet

    hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(a, b).compile().as_text()
    # A is never gathered: what the program gathers is vector-sized.
    gathered = [
        math.prod(int(d) for d in shape.split(",") if d)
        for shape in re.findall(r"= \w+\[([\d,]*)\][^ ]* all-gather(?:-start)?\(", hlo)
    ]
    assert all(size <= n for size in gathered), gathered
    targets = {
        t: hlo.count(f'custom_call_target="{t}"')
        for t in ("jaxmg_potrf", "jaxmg_potrs", "jaxmg_potri", "jaxmg_getrf")
    }
    assert targets == {"jaxmg_potrf": 0, "jaxmg_potrs": 1, "jaxmg_potri": 0, "jaxmg_getrf": 0}
    assert hlo.count('custom_call_target="jaxmg_potrs_factored"') == 1  # the adjoint solve
    assert hlo.count('custom_call_target="jaxmg_potri_factored"') == 1  # logdet's A^-1
    # And the plain solve still makes one native call.
    forward = jax.jit(lambda s, b: jaxmg.potrs(s, b, **native)).lower(a, b)
    assert forward.compile().as_text().count('custom_call_target="jaxmg_') == 1


def test_failed_factorisation_gives_nan_derivatives(mesh):
    n = size()
    spec = FORMS["cols"]
    a0 = hpd(n, np.float64)
    a0[1, 1] = -5.0  # not positive definite
    a, b = put(a0, mesh, spec), jnp.ones((n,), jnp.float64)

    def loss(s, b):
        x, logdet, status = jaxmg.potrs(
            s, b, return_logdet=True, return_status=True, mesh=mesh, in_specs=spec
        )
        return jnp.sum(x) + logdet, status

    (value, status), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(a, b)
    assert int(status) > 0
    assert np.isnan(float(value))
    assert all(np.isnan(np.asarray(g)).all() for g in grads)
    factor = jaxmg.cho_factor(a)
    assert int(factor.status) > 0 and np.isnan(float(factor.logdet))
    assert np.isnan(
        np.asarray(jax.grad(lambda s: jaxmg.cho_factor(s, mesh=mesh, in_specs=spec).logdet)(a))
    ).all()


@pytest.mark.parametrize("form", FORMS)
def test_explicit_axes_differentiate_with_respect_to_a(form):
    """On a mesh with Explicit axes (jax.make_mesh's default) the gradient with respect to A
    itself is the Hermitian part of the general one, sharded like A."""
    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    n = size()
    spec = FORMS[form]
    a0, b0 = hpd(n, np.float64), random(n, np.float64, 1, cols=1)
    a = put(a0, mesh, spec)
    w0 = random(n, np.float64, 7)
    w = put(w0, mesh, spec)
    cases = {
        "potrs": (
            lambda s: jnp.sum(jaxmg.potrs(s, b0) ** 2),
            lambda s: jnp.sum(jnp.linalg.solve(s, b0) ** 2),
        ),
        "logdet": (lambda s: jaxmg.cho_factor(s).logdet, lambda s: jnp.linalg.slogdet(s)[1]),
        "potri": (lambda s: jnp.sum(jaxmg.potri(s) * w), lambda s: jnp.sum(jnp.linalg.inv(s) * w0)),
        "syevd": (
            lambda s: jnp.sum(jaxmg.syevd(s, return_eigenvectors=False) ** 3),
            lambda s: jnp.sum(jnp.linalg.eigvalsh(s) ** 3),
        ),
    }
    for name, (ours, theirs) in cases.items():
        got = jax.jit(jax.grad(ours))(a)
        want = jax.grad(lambda s, f=theirs: f(herm(s)))(jnp.asarray(a0))
        assert got.sharding.spec == spec, name
        close(got, want)
