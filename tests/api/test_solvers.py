"""jaxmg.potrs / potri / syevd against numpy on every simulated device count.

Each routine x dtype x sharding form runs eagerly and under jit, and is checked with LAPACK-style
scaled residuals against numpy/scipy, which share no code with jaxmg.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from matrices import hpd

import jaxmg

# Single precision runs on 4 devices only (tests/conftest.py); double precision on every count.
SWEPT = pytest.mark.dtype_sweep
DTYPES = [
    pytest.param(np.float32, marks=SWEPT),
    np.float64,
    pytest.param(np.complex64, marks=SWEPT),
    np.complex128,
]
FORMS = {"cols": P(None, "x"), "rows": P("x", None)}
BOUND = 30.0

# (relayout, T_A) with 12 columns per device: a tile that divides the shard (whole tiles move)
# and one that does not (tiles split between devices; the native buffers get an extra tile).
ROUTES = [("native", 4), ("native", 5), ("jax", 5)]
ROUTE_IDS = [f"{r}-T{t}" for r, t in ROUTES]


def hermitian(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        m = m + 1j * rng.standard_normal((n, n))
    return ((m + m.conj().T) / 2).astype(dtype)


def eps(dtype):
    return np.finfo(dtype).eps


def mesh_of_all():
    return jax.make_mesh((jax.device_count(),), ("x",))


def put(a, mesh, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def size_for(ndev, per_device=12):
    return ndev * per_device


def to_cyclic(a_host, mesh, form, T_A):
    """``A`` in the block-cyclic layout of its form: columns permuted for column sharding,
    rows for row sharding (the layout of the solver's ``conj(A) = A^T``)."""
    if form == "cols":
        return jaxmg.cyclic_1d_layout(put(a_host, mesh, FORMS["cols"]), T_A)
    return put(np.asarray(jaxmg.cyclic_1d_layout(put(a_host.T, mesh, FORMS["cols"]), T_A)).T,
               mesh, FORMS["rows"])  # fmt: skip


def from_cyclic(m, mesh, form, T_A, n):
    """The inverse of :func:`to_cyclic`, on host arrays."""
    if form == "cols":
        return np.asarray(jaxmg.undo_cyclic_1d_layout(put(m, mesh, FORMS["cols"]), T_A, n))
    return np.asarray(jaxmg.undo_cyclic_1d_layout(put(m.T, mesh, FORMS["cols"]), T_A, n)).T


def scaled(value, n, dtype):
    return value / (n * eps(dtype))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("relayout, T_A", ROUTES, ids=ROUTE_IDS)
def test_potrs(form, dtype, jit, relayout, T_A):
    mesh = mesh_of_all()
    n = size_for(mesh.size)
    a_host = hpd(n, dtype)
    b_host = np.random.default_rng(1).standard_normal((n, 3)).astype(dtype)
    a = put(a_host, mesh, FORMS[form])
    b = put(b_host, mesh, P())

    def solve(a, b):
        return jaxmg.potrs(a, b, T_A, return_status=True, relayout=relayout)

    x, status = jax.jit(solve)(a, b) if jit else solve(a, b)
    assert int(status) == 0
    x = np.asarray(x)
    assert x.shape == (n, 3) and x.dtype == dtype
    r = np.linalg.norm(a_host @ x - b_host) / (
        np.linalg.norm(a_host, 1) * np.linalg.norm(x) * n * eps(dtype)
    )
    assert r < BOUND, r


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("relayout, T_A", ROUTES, ids=ROUTE_IDS)
def test_potri(form, dtype, relayout, T_A):
    mesh = mesh_of_all()
    n = size_for(mesh.size)
    a_host = hpd(n, dtype, seed=2)
    inv, status = jaxmg.potri(
        put(a_host, mesh, FORMS[form]), T_A, return_status=True, relayout=relayout
    )
    assert int(status) == 0
    assert inv.sharding.spec == FORMS[form]
    x = np.asarray(inv)
    np.testing.assert_allclose(x, x.conj().T, rtol=0, atol=0)  # exactly Hermitian
    r = np.linalg.norm(a_host @ x - np.eye(n)) / (
        np.linalg.norm(a_host, 1) * np.linalg.norm(x, 1) * n * eps(dtype)
    )
    assert r < BOUND, r


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vectors", [True, False], ids=["vectors", "values"])
@pytest.mark.parametrize("relayout, T_A", ROUTES, ids=ROUTE_IDS)
def test_syevd(form, dtype, vectors, relayout, T_A):
    mesh = mesh_of_all()
    n = size_for(mesh.size)
    a_host = hermitian(n, dtype, seed=3)
    out = jaxmg.syevd(
        put(a_host, mesh, FORMS[form]),
        T_A,
        return_eigenvectors=vectors,
        return_status=True,
        relayout=relayout,
    )
    w, status = out[0], out[-1]
    assert int(status) == 0
    w = np.asarray(w)
    assert w.dtype == np.finfo(dtype).dtype and w.shape == (n,)
    w_ref = np.linalg.eigvalsh(a_host.astype(np.complex128))
    norm_a = np.linalg.norm(a_host, 2)
    assert scaled(np.max(np.abs(w - w_ref)) / norm_a, n, dtype) < BOUND
    if vectors:
        v = np.asarray(out[1])
        assert out[1].sharding.spec == FORMS[form]
        ortho = np.linalg.norm(v.conj().T @ v - np.eye(n), 1)
        assert scaled(ortho, n, dtype) < BOUND
        resid = np.linalg.norm(a_host @ v - v * w[None, :], 1) / norm_a
        assert scaled(resid, n, dtype) < BOUND


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("cyclic", [False, True], ids=["block", "cyclic"])
@pytest.mark.parametrize("relayout, T_A", ROUTES, ids=ROUTE_IDS)
def test_no_shardmap_forms_inside_a_users_shard_map(form, cyclic, relayout, T_A):
    """The three *_no_shardmap functions on local blocks, in the user's own (vma-checked)
    shard_map, in either form and layout: the same answers as numpy."""
    mesh = mesh_of_all()
    n = size_for(mesh.size)
    dtype = np.complex128
    a_host = hpd(n, dtype, seed=4)
    b_host = np.random.default_rng(4).standard_normal((n, 2)).astype(dtype)
    spec = FORMS[form]
    a = to_cyclic(a_host, mesh, form, T_A) if cyclic else put(a_host, mesh, spec)
    local = dict(T_A=T_A, cyclic_1d=cyclic, sharded_by=form, relayout=relayout)

    def body(a, b):
        x, s1 = jaxmg.potrs_no_shardmap(a, b, **local)
        inv, s2 = jaxmg.potri_no_shardmap(a, **local)
        w, v, s3 = jaxmg.syevd_no_shardmap(a, **local)
        return x, inv, w, v, s1 + s2 + s3

    run = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=(spec, P()), out_specs=(P(), spec, P(), spec, P()))
    )
    x, inv, w, v, status = (np.asarray(o) for o in run(a, jnp.asarray(b_host)))
    if cyclic:  # the block results come back in the layout they went in
        inv, v = (from_cyclic(m, mesh, form, T_A, n) for m in (inv, v))
    assert int(status[0]) == 0
    tol = 1e3 * n * eps(dtype)
    np.testing.assert_allclose(x, np.linalg.solve(a_host, b_host), rtol=tol)
    np.testing.assert_allclose(inv, np.linalg.inv(a_host), rtol=tol, atol=tol)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(a_host), rtol=tol)
    np.testing.assert_allclose(a_host @ v, v * w, atol=tol * np.abs(w).max())


def test_potrs_vector_rhs_and_wide_rhs():
    mesh = mesh_of_all()
    n = size_for(mesh.size)
    a_host = hpd(n, np.float64)
    a = put(a_host, mesh, P(None, "x"))
    b1 = np.arange(n, dtype=np.float64)
    x1 = jaxmg.potrs(a, jnp.asarray(b1), 4)
    assert x1.shape == (n,)
    np.testing.assert_allclose(np.asarray(x1), np.linalg.solve(a_host, b1), rtol=1e-10)
    wide = np.random.default_rng(5).standard_normal((n, 300))
    xw = jaxmg.potrs(a, jnp.asarray(wide), 4)
    np.testing.assert_allclose(np.asarray(xw), np.linalg.solve(a_host, wide), rtol=1e-9)


@pytest.mark.parametrize("form", FORMS)
def test_not_positive_definite_gives_status_and_nan(form):
    mesh = mesh_of_all()
    n = size_for(mesh.size)
    a_host = hpd(n, np.float64)
    a_host[5, 5] = -1e3  # leading minor of order 6 is not positive definite
    a = put(a_host, mesh, FORMS[form])
    x, status = jaxmg.potrs(a, jnp.ones((n, 1)), 4, return_status=True)
    assert int(status) == 6
    assert np.isnan(np.asarray(x)).all()
    inv, status = jaxmg.potri(a, 4, return_status=True)
    assert int(status) == 6
    assert np.isnan(np.asarray(inv)).all()


def test_readme_diagonal_example():
    """The original README's potrs example, on whatever devices exist."""
    mesh = mesh_of_all()
    n = 12 if 12 % mesh.size == 0 else 4 * mesh.size
    T_A = 2 if n // mesh.size > 2 else n // mesh.size
    A = jnp.diag(jnp.arange(n, dtype=jnp.float64) + 1)
    b = jnp.ones((n, 1), dtype=jnp.float64)
    A = jax.device_put(A, NamedSharding(mesh, P(None, "x")))
    b = jax.device_put(b, NamedSharding(mesh, P(None, None)))
    out = jaxmg.potrs(A, b, T_A=T_A, mesh=mesh, in_specs=(P(None, "x"), P(None, None)))
    expected = 1.0 / (np.arange(n) + 1)
    np.testing.assert_allclose(np.asarray(out).ravel(), expected, rtol=1e-14)


def test_cyclic_1d_input_matches():
    mesh = mesh_of_all()
    n = size_for(mesh.size)
    a_host = hpd(n, np.float64)
    a = put(a_host, mesh, P(None, "x"))
    a_bc = jaxmg.cyclic_1d_layout(a, 4)
    b = jnp.ones((n, 2))
    x = jaxmg.potrs(a_bc, b, 4, cyclic_1d=True)
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(a_host, np.ones((n, 2))), rtol=1e-9)
    inv_bc = jaxmg.potri(a_bc, 4, cyclic_1d=True)
    inv = jaxmg.undo_cyclic_1d_layout(inv_bc, 4, n)
    np.testing.assert_allclose(np.asarray(inv), np.linalg.inv(a_host), rtol=1e-8, atol=1e-12)


def test_cyclic_1d_wrong_data_is_nan_not_crash():
    mesh = mesh_of_all()
    n = size_for(mesh.size)
    a_bc = jaxmg.cyclic_1d_layout(put(hpd(n, np.float64), mesh, P(None, "x")), 4)
    garbage = -jnp.abs(a_bc) - 1.0  # a negative diagonal: never positive definite
    x, status = jaxmg.potrs(garbage, jnp.ones((n, 1)), 4, cyclic_1d=True, return_status=True)
    assert int(status) != 0
    assert np.isnan(np.asarray(x)).all()


def test_no_all_gather_of_a():
    mesh = mesh_of_all()
    n = size_for(mesh.size)
    a = put(hpd(n, np.float64), mesh, P(None, "x"))
    b = put(np.ones((n, 1)), mesh, P())
    hlo = jax.jit(lambda a, b: jaxmg.potrs(a, b, 4)).lower(a, b).compile().as_text()
    gathers = [line for line in hlo.splitlines() if "all-gather" in line and f"{n},{n}" in line]
    assert not gathers, gathers


@pytest.mark.parametrize("form", FORMS)
def test_potri_fills_its_inverse_without_all_to_all(form):
    """potri's Hermitian fill trades blocks pairwise in place; an all_to_all would hold a second
    copy of the whole result (three on XLA:CPU)."""
    mesh = mesh_of_all()
    a = put(hpd(size_for(mesh.size), np.float64), mesh, FORMS[form])
    hlo = jax.jit(lambda a: jaxmg.potri(a, 4)).lower(a).compile().as_text()
    assert "all-to-all" not in hlo


@pytest.mark.parametrize("form", FORMS)
def test_donated_a_is_solved_in_its_own_buffer(form):
    """With A donated, potri's inverse and syevd's V take over A's buffer (XLA aliases it)."""
    mesh = mesh_of_all()
    n = size_for(mesh.size)
    a_host = hpd(n, np.float64)
    inv_fn = jax.jit(lambda a: jaxmg.potri(a, 4), donate_argnums=0)
    eig_fn = jax.jit(lambda a: jaxmg.syevd(a, 4), donate_argnums=0)
    for fn in (inv_fn, eig_fn):
        analysis = fn.lower(put(a_host, mesh, FORMS[form])).compile().memory_analysis()
        assert analysis.alias_size_in_bytes == a_host.nbytes // mesh.size
    inv = inv_fn(put(a_host, mesh, FORMS[form]))
    np.testing.assert_allclose(np.asarray(inv), np.linalg.inv(a_host), rtol=1e-9, atol=1e-12)
    w, v = eig_fn(put(a_host, mesh, FORMS[form]))
    v = np.asarray(v)
    np.testing.assert_allclose(np.asarray(w), np.linalg.eigvalsh(a_host), rtol=1e-10)
    np.testing.assert_allclose(a_host @ v, v * np.asarray(w), atol=1e-10 * np.abs(w).max())


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.parametrize("ndev", range(1, 17))
def test_pairings_meet_every_pair_once(ndev):
    from jaxmg.programs.local import _pairings

    rounds = _pairings(ndev)
    met = [pair for pairs in rounds for pair in pairs]
    assert sorted(met) == [(a, b) for a in range(ndev) for b in range(a + 1, ndev)]
    for pairs in rounds:  # a device meets at most one partner per round
        devices = [d for pair in pairs for d in pair]
        assert len(devices) == len(set(devices))
    assert len(rounds) == (ndev - 1 if ndev % 2 == 0 else ndev if ndev > 1 else 0)


@given(
    per_device=st.integers(2, 10),
    nrhs=st.integers(1, 5),
    data=st.data(),
)
def test_potrs_property(per_device, nrhs, data):
    mesh = mesh_of_all()
    n = per_device * mesh.size
    valid = jaxmg.calculate_all_valid_T_A(per_device, mesh.size, per_device + 1)
    T_A = data.draw(st.sampled_from(valid))
    form = data.draw(st.sampled_from(sorted(FORMS)))
    relayout = data.draw(st.sampled_from(["native", "jax"]))
    a_host = hpd(n, np.float64, seed=n)
    b_host = np.random.default_rng(nrhs).standard_normal((n, nrhs))
    x = jaxmg.potrs(put(a_host, mesh, FORMS[form]), jnp.asarray(b_host), T_A, relayout=relayout)
    r = np.linalg.norm(a_host @ np.asarray(x) - b_host) / (
        np.linalg.norm(a_host, 1) * np.linalg.norm(np.asarray(x)) * n * eps(np.float64)
    )
    assert r < BOUND


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto])
def test_vmap_runs_sequentially(axis_type):
    """Both placements of the operands (reshard on Explicit axes, device_put on Auto ones) keep
    the batch dimension out of the sharding under vmap (device_put on Explicit axes does not:
    jax 0.12 then fails to lower the shard_map)."""
    mesh = jax.make_mesh((jax.device_count(),), ("x",), axis_types=(axis_type,))
    n = size_for(mesh.size)
    mats = np.stack([hpd(n, np.float64, seed=s) for s in range(3)])
    rhs = np.ones((3, n, 1))
    out = jax.vmap(lambda a, b: jaxmg.potrs(a, b, 4, mesh=mesh, in_specs=(P(None, "x"), P())))(
        jnp.asarray(mats), jnp.asarray(rhs)
    )
    for k in range(3):
        np.testing.assert_allclose(np.asarray(out[k]), np.linalg.solve(mats[k], rhs[k]), rtol=1e-9)
