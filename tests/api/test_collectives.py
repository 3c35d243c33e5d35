"""``backend="jax"`` on several devices: the Cholesky and LU families on the engine of XLA's
own collectives (jaxmg.engines.collectives), against numpy and scipy at the suite's device
count (2, 3, 4, 8), both forms, eagerly and under jit: solutions, the inverse, the factor
objects and the log-determinant, LAPACK's ``info`` and pivots (scipy's ``?potrf``, ``?getrf``
on the same matrix) and NaN on failure, derivatives against JAX's own dense solvers, ``vmap``,
programs exported for TPU and ROCm that hold no jaxmg target, and the calls inside a user's
``shard_map`` (differentiable here). The eigensolver's tests: test_collectives_eigen.py.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from jax.sharding import PartitionSpec as P
from matrices import DTYPES, FORMS, hpd, put, random, several_devices_mesh

import jaxmg
from jaxmg import engines
from jaxmg.engines.collectives import _columns, _inner, _rows
from jaxmg.solvers import hermitian

BOUND = 30.0


@pytest.fixture
def mesh():
    return several_devices_mesh()


def size(ndev):
    """``N`` with 8 columns per device: ``T_A=4`` is two tiles of the layout per device, each two
    of the engine's own (at most a quarter of a device's columns: 2), so that the engine's
    order of tiles is not ``A``'s (:func:`engine_order`); with ``T_A=2`` it is."""
    return 8 * ndev


def engine_order(n, ndev, T_A):
    """The rows of ``A`` in the engine's order: its Cholesky factors ``A[rows][:, rows]``, its
    LU ``A[:, rows]`` (LAPACK's ``info`` and pivots are those)."""
    return _rows(n, ndev, T_A or n // ndev, _inner(T_A or n // ndev, n, ndev))


def residual(a, x, b):
    """LAPACK's scaled residual ``||A x - b|| / (||A|| ||x|| N eps)``."""
    n = a.shape[0]
    scale = np.linalg.norm(a, 1) * np.linalg.norm(x) * n * np.finfo(a.dtype).eps
    return np.linalg.norm(a @ x - b) / scale


def test_the_engine_is_chosen_by_name_for_several_devices(mesh):
    a = put(hpd(size(mesh.size)), mesh, FORMS["rows"])
    geometry = engines.resolve(a, backend="jax")
    assert geometry.backend == "jax" and geometry.ndev == mesh.size
    assert geometry.engine is engines.collectives.ENGINE
    # The default on CPUs stays the LAPACK twin where jaxmg-cuda is installed (else "jax").
    assert engines.resolve(a).backend == ("mg" if engines.base.native_installed() else "jax")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", FORMS)
def test_potrs_against_numpy(mesh, dtype, form):
    n = size(mesh.size)
    a, b = hpd(n, dtype), random(n, dtype, seed=1, cols=3)
    x, status = jaxmg.potrs(
        put(a, mesh, FORMS[form]), jnp.asarray(b), 4, backend="jax", return_status=True
    )
    assert int(status) == 0
    assert residual(a, np.asarray(x), b) < BOUND


def test_potrs_under_jit_with_the_engines_own_tile(mesh):
    """``T_A=None``: JAX's own blocks, which need no relayout, and the engine's own tiles."""
    n = size(mesh.size)
    a, b = hpd(n, np.complex128, seed=11), random(n, np.complex128, seed=12)[:, 0]
    x = jax.jit(lambda a, b: jaxmg.potrs(a, b, backend="jax"))(put(a, mesh, FORMS["cols"]), b)
    assert residual(a, np.asarray(x), b) < BOUND


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("form", FORMS)
def test_factor_solves_and_logdet(mesh, dtype, form):
    n = size(mesh.size)
    a = hpd(n, dtype, seed=2)
    factor = jaxmg.cho_factor(put(a, mesh, FORMS[form]), 4, backend="jax")
    for seed in (3, 4):
        b = random(n, dtype, seed=seed)[:, 0]
        assert residual(a, np.asarray(jaxmg.cho_solve(factor, jnp.asarray(b))), b) < BOUND
    sign, expected = np.linalg.slogdet(a)
    assert sign.real > 0
    np.testing.assert_allclose(float(factor.logdet), expected, rtol=1e-12)
    x, logdet = jaxmg.potrs(
        put(a, mesh, FORMS[form]), jnp.ones(n, dtype), backend="jax", return_logdet=True
    )
    np.testing.assert_allclose(float(logdet), expected, rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("where", [0, 5, "last"])
@pytest.mark.parametrize("T_A", [2, None])
def test_not_positive_definite_gives_lapacks_info_and_nan(mesh, dtype, where, T_A):
    """LAPACK's ``info`` of ``A`` in the engine's order of tiles (``A``'s own for ``T_A=2``;
    not mapped back to ``A``'s order: docs/sharp-bits.md)."""
    n = size(mesh.size)
    a = hpd(n, dtype, seed=5)
    k = n - 1 if where == "last" else where
    a[k, k] = -1.0
    rows = engine_order(n, mesh.size, T_A)
    potrf = scipy.linalg.lapack.dpotrf if dtype == np.float64 else scipy.linalg.lapack.zpotrf
    info = potrf(a[np.ix_(rows, rows)], lower=True)[1]
    assert info > 0
    if T_A == 2:
        assert info == potrf(a, lower=True)[1]
    x, status = jaxmg.potrs(
        put(a, mesh, FORMS["cols"]), jnp.ones(n, dtype), T_A, backend="jax", return_status=True
    )
    assert int(status) == info
    assert np.isnan(np.asarray(x)).all()


def test_derivatives_against_jax(mesh):
    n = size(mesh.size)
    a, b = hpd(n, seed=6), random(n, seed=7)[:, 0]

    def ours(a, b):
        return jnp.sum(jnp.sin(jaxmg.potrs(a, b, 4, backend="jax")))

    def theirs(a, b):
        return jnp.sum(jnp.sin(jnp.linalg.solve((a + a.T) / 2, b)))

    with jax.set_mesh(mesh):
        got = jax.jit(jax.grad(ours, argnums=(0, 1)))(put(a, mesh, FORMS["rows"]), jnp.asarray(b))
    want = jax.grad(theirs, argnums=(0, 1))(jnp.asarray(a), jnp.asarray(b))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-9, atol=1e-12)


def test_vmap_solves_a_batch_as_one_program(mesh):
    n = size(mesh.size)
    a = np.stack([hpd(n, seed=s) for s in range(3)])
    b = random(n, seed=8, cols=3).T
    spec = P(None, "x", None)
    solve = jax.vmap(
        lambda a, b: jaxmg.potrs(a, b, 4, mesh=mesh, in_specs=P("x", None), backend="jax")
    )
    x = np.asarray(jax.jit(solve)(put(a, mesh, spec), jnp.asarray(b)))
    for i in range(3):
        assert residual(a[i], x[i], b[i]) < BOUND


@pytest.mark.parametrize("platform", ["tpu", "rocm"])
def test_exported_for_other_platforms_with_no_jaxmg_target(mesh, platform):
    """CI has no TPU or AMD GPU: a program for one holds no target of jaxmg's (JAX's own
    Cholesky, LU and triangular solves lower to that platform's own calls)."""
    n = size(mesh.size)
    a = put(hpd(n), mesh, FORMS["rows"])

    def every_routine(a, b):
        lu = jaxmg.lu_factor(a, 4, backend="jax")
        return (
            jaxmg.potrs(a, b, 4, backend="jax"),
            jaxmg.lu_solve(lu, b),
            jaxmg.potri(a, 4, backend="jax"),
        )

    exported = jax.export.export(jax.jit(every_routine), platforms=(platform,))(a, jnp.ones(n))
    text = exported.mlir_module()
    assert "all_reduce" in text  # the collectives are there
    targets = set(re.findall(r"custom_call @(\w+)", text))
    assert not {t for t in targets if "jaxmg" in t.lower()}, targets


def test_potrs_in_a_users_shard_map_is_differentiable(mesh):
    n = size(mesh.size)
    a, b = hpd(n, seed=9), random(n, seed=10)[:, 0]

    def solve(block, b):
        x, _ = jaxmg.potrs_no_shardmap(block, b, 4, sharded_by="rows", backend="jax")
        return x

    mapped = jax.shard_map(
        solve, mesh=mesh, in_specs=(P("x", None), P()), out_specs=P(), check_vma=False
    )
    x = mapped(put(a, mesh, FORMS["rows"]), jnp.asarray(b))
    assert residual(a, np.asarray(x), b) < BOUND
    with jax.set_mesh(mesh):
        grad = jax.jit(jax.grad(lambda b: jnp.sum(mapped(put(a, mesh, FORMS["rows"]), b))))(
            jnp.asarray(b)
        )
    np.testing.assert_allclose(np.asarray(grad), np.linalg.solve(a, np.ones(n)), rtol=1e-9)


def test_a_tile_that_does_not_divide_the_blocks_is_refused(mesh):
    n = size(mesh.size)  # 8 rows per device
    with pytest.raises(ValueError, match="divide"):
        jaxmg.potrs(put(hpd(n), mesh, FORMS["rows"]), jnp.ones(n), 3, backend="jax")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", FORMS)
def test_potri_against_numpy(mesh, dtype, form):
    n = size(mesh.size)
    a = hpd(n, dtype, seed=13)
    inverse = jaxmg.potri(put(a, mesh, FORMS[form]), 4, backend="jax")
    assert inverse.sharding.spec == FORMS[form]
    eps = np.finfo(dtype).eps
    error = np.linalg.norm(np.asarray(inverse) @ a - np.eye(n), 1) / (
        n * eps * np.linalg.cond(a, 1)
    )
    assert error < BOUND


def test_potri_of_a_matrix_not_positive_definite_is_nan(mesh):
    n = size(mesh.size)
    a = hpd(n, seed=14)
    a[6, 6] = -2.0
    inverse, status = jaxmg.potri(put(a, mesh, FORMS["rows"]), 2, backend="jax", return_status=True)
    assert int(status) == scipy.linalg.lapack.dpotrf(a, lower=True)[1] > 0
    assert np.isnan(np.asarray(inverse)).all()


def pivoting(n, dtype, seed):
    """A general matrix whose LU interchanges rows at every step: rows scaled apart."""
    m = random(n, dtype, seed)
    scale = np.logspace(0, 2, n)[np.random.default_rng(seed).permutation(n), None]
    return (m * scale).astype(dtype)


def global_pivots(factor, mesh):
    """LAPACK's 1-based ``ipiv`` ``[N]`` from a factor's pivots (each device's own columns)."""
    ndev, local = mesh.size, factor.pivots.shape[0] // mesh.size
    columns = _columns(ndev, local, _inner(4, ndev * local, ndev))
    ipiv = np.zeros(columns.size, np.int64)
    ipiv[columns.ravel()] = np.asarray(factor.pivots)
    return ipiv


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", FORMS)
def test_lu_against_scipy(mesh, dtype, form):
    """Every ``trans``; with ``A`` by columns the factor's own pivots are LAPACK's of ``A``'s
    columns in the engine's order (scipy's ``?getrf``: partial pivoting picks the same rows,
    blocked or not)."""
    n = size(mesh.size)
    a = pivoting(n, dtype, seed=15)
    b = random(n, dtype, seed=16, cols=2)
    factor = jax.jit(lambda a: jaxmg.lu_factor(a, 4, backend="jax"))(put(a, mesh, FORMS[form]))
    assert int(factor.status) == 0
    for trans, op in ((0, a), (1, a.T), (2, a.conj().T)):
        x = np.asarray(jaxmg.lu_solve(factor, jnp.asarray(b), trans=trans))
        assert residual(op, x, b) < BOUND, trans
    if form == "cols":
        _, piv = scipy.linalg.lu_factor(a[:, engine_order(n, mesh.size, 4)])
        np.testing.assert_array_equal(global_pivots(factor, mesh), piv + 1)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("column", [0, 6, "last"])
@pytest.mark.parametrize("T_A", [2, None])
def test_singular_lu_gives_lapacks_info_and_nan(mesh, dtype, column, T_A):
    """LAPACK's ``info`` of ``A``'s columns in the engine's order (``A``'s own for ``T_A=2``;
    LU's status is not mapped back to ``A``'s order: docs/sharp-bits.md)."""
    n = size(mesh.size)
    a = pivoting(n, dtype, seed=17)
    a[:, n - 1 if column == "last" else column] = 0
    getrf = scipy.linalg.lapack.dgetrf if dtype == np.float64 else scipy.linalg.lapack.zgetrf
    info = getrf(a[:, engine_order(n, mesh.size, T_A)])[2]
    assert info > 0
    if T_A == 2:
        assert info == getrf(a)[2]
    factor = jaxmg.lu_factor(put(a, mesh, FORMS["cols"]), T_A, backend="jax")
    assert int(factor.status) == info
    assert np.isnan(np.asarray(jaxmg.lu_solve(factor, jnp.ones(n, dtype)))).all()


def test_lu_and_inverse_derivatives_against_jax(mesh):
    """The existing rules on this engine: ``lu_solve`` against ``jnp.linalg.solve``, the
    inverse and the log-determinant (whose derivative needs the inverse) against JAX's."""
    n = size(mesh.size)
    a, h, b = pivoting(n, np.float64, seed=18), hpd(n, seed=19), random(n, seed=20)[:, 0]

    def ours(a, h, b):
        lu = jaxmg.lu_factor(a, 4, backend="jax")
        factor = jaxmg.cho_factor(h, 4, backend="jax")
        x = jaxmg.lu_solve(lu, b, trans=1)
        return jnp.sum(jnp.sin(x)) + jnp.sum(jaxmg.potri(h, 4, backend="jax") ** 2) + factor.logdet

    def theirs(a, h, b):
        h = (h + h.T) / 2
        x = jnp.linalg.solve(a.T, b)
        return jnp.sum(jnp.sin(x)) + jnp.sum(jnp.linalg.inv(h) ** 2) + jnp.linalg.slogdet(h)[1]

    with jax.set_mesh(mesh):
        got = jax.jit(jax.grad(ours, argnums=(0, 1, 2)))(
            put(a, mesh, FORMS["cols"]), put(h, mesh, FORMS["rows"]), jnp.asarray(b)
        )
    want = jax.grad(theirs, argnums=(0, 1, 2))(jnp.asarray(a), jnp.asarray(h), jnp.asarray(b))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-8, atol=1e-11)


def test_lu_under_vmap_solves_a_batch_as_one_program(mesh):
    n = size(mesh.size)
    a = np.stack([pivoting(n, np.float64, seed=s) for s in range(3)])
    b = random(n, seed=21, cols=3).T

    def solve(a, b):
        lu = jaxmg.lu_factor(a, 4, mesh=mesh, in_specs=P(None, "x"), backend="jax")
        return jaxmg.lu_solve(lu, b)

    x = np.asarray(jax.jit(jax.vmap(solve))(put(a, mesh, P(None, None, "x")), jnp.asarray(b)))
    for i in range(3):
        assert residual(a[i], x[i], b[i]) < BOUND


def test_buckets_of_steps_against_numpy(mesh, monkeypatch):
    """The factorisations' steps in several loops of their own shapes (at the suite's sizes
    they run in one: ``SMALL``), on a size no other test traces (jaxmg caches its programs)."""
    monkeypatch.setattr(engines.collectives, "SMALL", 0)
    n = 12 * mesh.size  # tiles of 3, in the engine's order
    h, a, b = hpd(n, seed=22), pivoting(n, np.float64, seed=23), random(n, seed=24, cols=2)
    assert len(engines.collectives._buckets(n // 3, 3)) > 3
    x = jaxmg.potrs(put(h, mesh, FORMS["rows"]), jnp.asarray(b), backend="jax")
    assert residual(h, np.asarray(x), b) < BOUND
    lu = jaxmg.lu_factor(put(a, mesh, FORMS["cols"]), backend="jax")
    assert residual(a, np.asarray(jaxmg.lu_solve(lu, jnp.asarray(b))), b) < BOUND
    inverse = np.asarray(jaxmg.potri(put(h, mesh, FORMS["rows"]), backend="jax"))
    np.testing.assert_allclose(inverse, np.linalg.inv(h), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("routine", ["cho_factor", "lu_factor", "potri"])
def test_donated_a_is_the_results_buffer(mesh, routine):
    """``donate=True``: the program hands ``A``'s buffer to the factor (the inverse), with no
    'donated buffers were not usable' warning, consumes ``A``, and the results match numpy."""
    n = size(mesh.size)
    h = hpd(n, seed=25)
    a = put(h, mesh, FORMS["rows"])
    task = {"cho_factor": "potrs", "lu_factor": "getrf"}.get(routine, routine)
    call, _ = hermitian._prepare(
        a, None, mesh, FORMS["rows"], False, "native", True, "t", task, "jax"
    )
    program, args = {
        "cho_factor": (hermitian._potrf_donated, (call, a)),
        "lu_factor": (hermitian._getrf_donated, (call, a)),
        "potri": (hermitian._potri_donated, (call, True, a)),
    }[routine]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        header = program.lower(*args).compile().as_text().splitlines()[0]
    assert re.search(r"\{\d*\}: \(0, \{\}, (may|must)-alias\)", header), header
    b = random(n, seed=26)[:, 0]
    result = getattr(jaxmg, routine)(a, backend="jax", donate=True)
    assert a.is_deleted()
    if routine == "potri":
        np.testing.assert_allclose(np.asarray(result), np.linalg.inv(h), rtol=1e-10, atol=1e-12)
    else:
        solve = jaxmg.cho_solve if routine == "cho_factor" else jaxmg.lu_solve
        assert residual(h, np.asarray(solve(result, jnp.asarray(b))), b) < BOUND


def test_jvp_against_finite_differences(mesh):
    """Forward derivatives of ``potrs`` and ``lu_solve`` along a direction of ``A``, against
    central differences of the solves themselves."""
    n = size(mesh.size)
    h, g, b = hpd(n, seed=27), pivoting(n, np.float64, seed=28), random(n, seed=29)[:, 0]
    dh = random(n, seed=30)
    dh = (dh + dh.T) / 2
    dg = random(n, seed=31)

    def potrs(a):
        return jaxmg.potrs(a, jnp.asarray(b), 4, backend="jax")

    def lu(a):
        return jaxmg.lu_solve(jaxmg.lu_factor(a, 4, backend="jax"), jnp.asarray(b), trans=2)

    eps = 1e-6
    for solve, a, da, form in ((potrs, h, dh, "rows"), (lu, g, dg, "cols")):
        _, tangent = jax.jvp(solve, (put(a, mesh, FORMS[form]),), (put(da, mesh, FORMS[form]),))
        ahead = np.asarray(solve(put(a + eps * da, mesh, FORMS[form])))
        behind = np.asarray(solve(put(a - eps * da, mesh, FORMS[form])))
        np.testing.assert_allclose(
            np.asarray(tangent), (ahead - behind) / (2 * eps), rtol=1e-6, atol=1e-8
        )
