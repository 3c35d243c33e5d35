"""A solver axis of one device runs on JAX's own dense solvers (jaxmg.engines.dense), with jaxmg's
semantics whole: results against numpy/scipy, LAPACK's statuses (scipy's ``?potrf``/``?getrf``
``info`` on the same matrix), NaN on failure, factor objects, derivatives against JAX's own
dense functions, every mesh kind, eagerly, under jit, inside shard_map and vmap; the same
answers as the native engine (``backend="mg"``), which the compiled programs show is not
called.

The cases run in the 1-device process (``--num-cpu-devices=1``, which ``nox -s tests`` compiles
with XLA's optimising compiler, as users' programs are); single precision (``dtype_sweep``) in
the 4-device one, on a mesh of its first device. With several devices, the last test checks
that an axis of several devices keeps the native engine and that one device of them still
takes the dense path.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from matrices import hpd, random

import jaxmg
import jaxmg_cuda
from jaxmg import engines
from jaxmg.engines import ENGINES

SWEPT = pytest.mark.dtype_sweep
DTYPES = [
    pytest.param(np.float32, marks=SWEPT),
    np.float64,
    pytest.param(np.complex64, marks=SWEPT),
    np.complex128,
]
FORMS = {"cols": P(None, "x"), "rows": P("x", None)}
BOUND = 30.0
N = 24


@pytest.fixture
def solo(request):
    """A mesh of one device (Explicit axes, ``jax.make_mesh``'s default)."""
    return one_device_mesh(request)


def one_device_mesh(request, axis_type=AxisType.Explicit, name="x"):
    if jax.device_count() != 1 and not request.node.get_closest_marker("dtype_sweep"):
        pytest.skip("the one-device engine's cases run with --num-cpu-devices=1")
    return jax.make_mesh((1,), (name,), axis_types=(axis_type,), devices=jax.devices()[:1])


def hermitian(n, dtype, seed=0):
    m = random(n, dtype, seed)
    return ((m + m.conj().T) / 2).astype(dtype)


def general(n, dtype, seed=0):
    return (random(n, dtype, seed) + 2 * np.eye(n)).astype(dtype)


def put(a, mesh, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def eps(dtype):
    return np.finfo(dtype).eps


def residual(a, x, b):
    """LAPACK's scaled residual ``||A x - b|| / (||A|| ||x|| N eps)``."""
    n = a.shape[0]
    scale = np.linalg.norm(a, 1) * np.linalg.norm(x) * n * eps(a.dtype)
    return np.linalg.norm(a @ x - b) / scale


def hlo(fn, *args):
    return jax.jit(fn).lower(*args).compile().as_text()


def instructions(text):
    """The instructions of a compiled program, without their source locations."""
    lines = [line for line in text.splitlines() if line.lstrip().startswith(("%", "ROOT"))]
    return [re.sub(r", metadata=\{.*", "", line) for line in lines]


def jaxmg_calls(text):
    return text.count('custom_call_target="jaxmg_')


# --- every routine against numpy -------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_routine_against_numpy(solo, form, dtype):
    """potrs (and logdet), potri, syevd (with and without vectors), cho_factor + cho_solve (two
    solves, logdet), lu_factor + lu_solve with A, A^T and A^H; only the triangle the solver
    reads is filled (the other holds garbage)."""
    spec = FORMS[form]
    a0, g0 = hpd(N, dtype), general(N, dtype, 5)
    b0 = random(N, dtype, 1, cols=3)
    garbage = np.triu(np.full((N, N), 1e3), 1).astype(dtype)
    # Column sharding reads the lower triangle, row sharding the upper one.
    read = np.tril(a0) + garbage if form == "cols" else np.triu(a0) + garbage.T
    a, b = put(read, solo, spec), jnp.asarray(b0)

    x, logdet, status = jaxmg.potrs(a, b, return_logdet=True, return_status=True)
    assert int(status) == 0 and x.dtype == dtype
    assert residual(a0, np.asarray(x), b0) < BOUND
    np.testing.assert_allclose(float(logdet), np.linalg.slogdet(a0)[1], rtol=1e3 * eps(dtype))

    inv, status = jaxmg.potri(a, return_status=True)
    assert int(status) == 0 and inv.sharding.spec == spec
    inv = np.asarray(inv)
    np.testing.assert_array_equal(inv, inv.conj().T)  # exactly Hermitian
    assert residual(a0, inv, np.eye(N, dtype=dtype)) < BOUND

    w, v, status = jaxmg.syevd(put(hermitian(N, dtype, 3), solo, spec), return_status=True)
    w_only = jaxmg.syevd(put(hermitian(N, dtype, 3), solo, spec), return_eigenvectors=False)
    h = hermitian(N, dtype, 3)
    ref = np.linalg.eigvalsh(h.astype(np.complex128))
    norm = np.linalg.norm(h, 2)
    assert int(status) == 0 and w.dtype == np.finfo(dtype).dtype and v.sharding.spec == spec
    for values in (w, w_only):
        assert np.abs(np.asarray(values) - ref).max() / (norm * N * eps(dtype)) < BOUND
    v = np.asarray(v)
    assert np.linalg.norm(v.conj().T @ v - np.eye(N), 1) / (N * eps(dtype)) < BOUND
    assert np.linalg.norm(h @ v - v * np.asarray(w), 1) / (norm * N * eps(dtype)) < BOUND

    factor = jaxmg.cho_factor(a)
    assert int(factor.status) == 0
    for seed in (1, 2):
        rhs = random(N, dtype, seed, cols=2)
        assert residual(a0, np.asarray(jaxmg.cho_solve(factor, jnp.asarray(rhs))), rhs) < BOUND
    logdet_tol = 1e3 * eps(dtype)
    np.testing.assert_allclose(float(factor.logdet), np.linalg.slogdet(a0)[1], rtol=logdet_tol)

    lu = jaxmg.lu_factor(put(g0, solo, spec))
    assert int(lu.status) == 0
    for trans, op in ((0, g0), (1, g0.T), (2, g0.conj().T)):
        assert residual(op, np.asarray(jaxmg.lu_solve(lu, b, trans=trans)), b0) < BOUND
    one_call = jaxmg.lu_solve(put(g0, solo, spec), b, trans="T")
    assert residual(g0.T, np.asarray(one_call), b0) < BOUND


@pytest.mark.parametrize("form", FORMS)
def test_every_routine_under_jit(solo, form):
    """The same routines in one jitted program, with a vector right-hand side."""
    spec = FORMS[form]
    dtype = np.complex128
    a0, g0, h0 = hpd(N, dtype), general(N, dtype, 5), hermitian(N, dtype, 3)
    b0 = random(N, dtype, 1, cols=1)[:, 0]

    @jax.jit
    def run(a, g, h, b):
        x = jaxmg.potrs(a, b)
        factor = jaxmg.cho_factor(a)
        lu = jaxmg.lu_factor(g)
        w, v = jaxmg.syevd(h)
        return (x, jaxmg.potri(a), w, v, jaxmg.cho_solve(factor, b), factor.logdet,
                jaxmg.lu_solve(lu, b), jaxmg.lu_solve(lu, b, trans=2))  # fmt: skip

    out = run(put(a0, solo, spec), put(g0, solo, spec), put(h0, solo, spec), jnp.asarray(b0))
    x, inv, w, v, x2, logdet, y, yh = (np.asarray(o) for o in out)
    assert x.shape == (N,)
    tol = dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(x, np.linalg.solve(a0, b0), **tol)
    np.testing.assert_allclose(x2, np.linalg.solve(a0, b0), **tol)
    np.testing.assert_allclose(inv, np.linalg.inv(a0), **tol)
    np.testing.assert_allclose(logdet, np.linalg.slogdet(a0)[1], **tol)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(h0), **tol)
    np.testing.assert_allclose(h0 @ v, v * w, atol=1e-10 * np.abs(w).max())
    np.testing.assert_allclose(y, np.linalg.solve(g0, b0), **tol)
    np.testing.assert_allclose(yh, np.linalg.solve(g0.conj().T, b0), **tol)


# --- statuses and NaN ------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("k", [1, 2, 11, N - 1, N])
def test_not_positive_definite_at_a_known_order(solo, form, k):
    """The leading minor of order ``k`` is the first that is not positive definite: every
    Cholesky routine reports ``k`` (LAPACK's ``info``, from scipy on the matrix the solver
    reads) and NaN, as the native engine does."""
    a0 = hpd(N, np.float64, seed=k)
    a0[k - 1, k - 1] = -1e3
    info = scipy.linalg.lapack.dpotrf(a0, lower=1)[1]
    assert info == k  # the reference agrees with the construction
    a = put(a0, solo, FORMS[form])
    b = jnp.ones((N, 2))
    x, logdet, status = jaxmg.potrs(a, b, return_logdet=True, return_status=True)
    inv, inv_status = jaxmg.potri(a, return_status=True)
    factor = jaxmg.cho_factor(a)
    x_mg, status_mg = jaxmg.potrs(a, b, return_status=True, backend="mg")
    assert int(status) == int(inv_status) == int(factor.status) == int(status_mg) == k
    for out in (x, logdet, inv, factor.factor, factor.logdet, jaxmg.cho_solve(factor, b), x_mg):
        assert np.isnan(np.asarray(out)).all()


def test_not_positive_definite_complex_and_nan(solo):
    """complex128; and a NaN on the diagonal: status ``N + 1``, as on every backend for an
    ``A`` that holds NaN or Inf (scipy's LAPACK here, OpenBLAS's, reports no failure: info 0,
    and JAX's factor is NaN from that row on)."""
    a0 = hpd(N, np.complex128)
    a0[6, 6] = -2
    b = jnp.ones(N, a0.dtype)
    _, status = jaxmg.potrs(put(a0, solo, FORMS["rows"]), b, return_status=True)
    assert int(status) == scipy.linalg.lapack.zpotrf(a0.T, lower=1)[1] == 7
    a0 = hpd(N, np.float64)
    a0[9, 9] = np.nan
    x, status = jaxmg.potrs(put(a0, solo, FORMS["cols"]), jnp.ones(N), return_status=True)
    assert int(status) == N + 1
    assert np.isnan(np.asarray(x)).all()


@pytest.mark.parametrize("form", FORMS)
def test_exactly_singular_u_at_a_known_column(solo, form):
    """A zero column of ``A`` makes ``U[4, 4]`` exactly zero: status 5 as scipy's ``dgetrf``
    of ``A`` in both forms (a row-sharded ``A`` is transposed before it is factored), NaN
    solutions, the pivots kept."""
    g0 = general(N, np.float64)
    g0[:, 4] = 0
    assert scipy.linalg.lapack.dgetrf(g0)[2] == 5
    lu = jaxmg.lu_factor(put(g0, solo, FORMS[form]))
    assert int(lu.status) == 5
    assert np.isnan(np.asarray(lu.factor)).all()
    assert np.asarray(lu.pivots).min() >= 1  # LAPACK's 1-based ipiv
    for trans in (0, 1, 2):
        x, status = jaxmg.lu_solve(lu, jnp.ones(N), trans=trans, return_status=True)
        assert int(status) == 5 and np.isnan(np.asarray(x)).all()
    mg = jaxmg.lu_factor(put(g0, solo, FORMS[form]), backend="mg")
    assert int(mg.status) == 5


def test_failed_eigensolver_is_a_status_and_nan(solo):
    """A NaN matrix: JAX's eigensolver gives no order, so the status is N + 1."""
    a = put(np.full((N, N), np.nan), solo, FORMS["cols"])
    w, v, status = jaxmg.syevd(a, return_status=True)
    w_only, status_only = jaxmg.syevd(a, return_eigenvectors=False, return_status=True)
    assert int(status) == int(status_only) == N + 1
    assert all(np.isnan(np.asarray(o)).all() for o in (w, v, w_only))


def test_pivots_are_lapacks(solo):
    """The pivots of lu_factor are LAPACK's 1-based ipiv (what the native engine hands on)."""
    g0 = general(N, np.float64, 9)
    lu = jaxmg.lu_factor(put(g0, solo, FORMS["cols"]))
    ref_lu, ref_piv, _ = scipy.linalg.lapack.dgetrf(g0)
    np.testing.assert_array_equal(np.asarray(lu.pivots), ref_piv + 1)
    np.testing.assert_allclose(np.asarray(lu.factor).T, ref_lu, rtol=1e-12, atol=1e-13)


# --- derivatives -----------------------------------------------------------------------------


def herm(s):
    return (s + jnp.conj(s).T) / 2


@pytest.mark.parametrize("form", FORMS)
def test_derivatives_against_jax(request, form):
    """Gradients through potrs (+ logdet), cho_factor/cho_solve, lu_solve (N, T, C), potri and
    syevd, under jit, against JAX's own dense functions (Auto axes: the functions symmetrise
    the sharded matrix freely). tests/api/test_autodiff.py, which runs on this path with one
    device, checks them against finite differences too."""
    solo = one_device_mesh(request, AxisType.Auto)
    spec = FORMS[form]
    dtype = np.float64
    a0, g0 = hpd(N, dtype), general(N, dtype, 5)
    b0, w0 = random(N, dtype, 1, cols=2), random(N, dtype, 7)
    mesh_kw = dict(mesh=solo, in_specs=spec)

    def ours(s, g, b):
        x, logdet = jaxmg.potrs(herm(s), b, return_logdet=True, **mesh_kw)
        factor = jaxmg.cho_factor(herm(s), **mesh_kw)
        lu = jaxmg.lu_factor(g, **mesh_kw)
        solves = sum(jnp.sum(jaxmg.lu_solve(lu, b, trans=t) ** 2) for t in (0, 1, 2))
        w, v = jaxmg.syevd(herm(s), **mesh_kw)
        return (jnp.sum(x**2) + logdet + jnp.sum(jaxmg.cho_solve(factor, b)) + factor.logdet
                + solves + jnp.sum(jaxmg.potri(herm(s), **mesh_kw) * w0) + jnp.sum(w**3)
                + jnp.sum(jnp.abs(v[:, :3]) ** 2 * w0[:, :3]))  # fmt: skip

    def theirs(s, g, b):
        h = herm(s)
        x, logdet = jnp.linalg.solve(h, b), jnp.linalg.slogdet(h)[1]
        solves = sum(jnp.sum(jnp.linalg.solve(m, b) ** 2) for m in (g, g.T, jnp.conj(g).T))
        w, v = jnp.linalg.eigh(h)
        return (jnp.sum(x**2) + logdet + jnp.sum(x) + logdet + solves
                + jnp.sum(jnp.linalg.inv(h) * w0) + jnp.sum(w**3)
                + jnp.sum(jnp.abs(v[:, :3]) ** 2 * w0[:, :3]))  # fmt: skip

    a, g, b = put(a0, solo, spec), put(g0, solo, spec), jnp.asarray(b0)
    got = jax.jit(jax.grad(ours, argnums=(0, 1, 2)))(a, g, b)
    want = jax.grad(theirs, argnums=(0, 1, 2))(jnp.asarray(a0), jnp.asarray(g0), b)
    for mine, ref in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(mine), np.asarray(ref), rtol=1e-8, atol=1e-9)


# --- where the dense path runs, and what it compiles ------------------------------------------


def test_default_program_calls_no_native_target(solo):
    """The default program on one device is JAX's LAPACK calls (no jaxmg custom call); with
    backend="mg" it is jaxmg's native target. Both give the same answers."""
    a0, g0 = hpd(N, np.float64), general(N, np.float64, 5)
    a, g, b = put(a0, solo, FORMS["cols"]), put(g0, solo, FORMS["cols"]), jnp.ones((N, 2))

    def everything(a, g, b, backend=None):
        kw = dict(backend=backend)
        x, logdet = jaxmg.potrs(a, b, return_logdet=True, **kw)
        w, v = jaxmg.syevd(a, **kw)
        return (x, logdet, jaxmg.potri(a, **kw), w, v,
                jaxmg.syevd(a, return_eigenvectors=False, **kw),
                jaxmg.lu_solve(g, b, **kw), jaxmg.lu_solve(g, b, trans=1, **kw))  # fmt: skip

    dense = hlo(everything, a, g, b)
    assert jaxmg_calls(dense) == 0
    assert "lapack_dpotrf" in dense and "lapack_dgetrf" in dense and "lapack_dsyevd" in dense
    native = hlo(lambda a, g, b: everything(a, g, b, "mg"), a, g, b)
    assert jaxmg_calls(native) >= 5
    ours = jax.jit(everything)(a, g, b)
    theirs = jax.jit(lambda a, g, b: everything(a, g, b, "mg"))(a, g, b)
    for mine, ref in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(np.abs(np.asarray(mine)), np.abs(np.asarray(ref)), atol=1e-11)


def test_tile_and_pad_do_not_matter(solo):
    """An explicit T_A is accepted and changes nothing (one tile: the whole matrix); pad=False
    refuses nothing, since no block is widened."""
    a0 = hpd(N, np.float64)
    a, b = put(a0, solo, FORMS["rows"]), jnp.ones(N)
    base = instructions(hlo(lambda a, b: jaxmg.potrs(a, b), a, b))
    other = hlo(lambda a, b: jaxmg.potrs(a, b, T_A=5, pad=False, relayout="jax"), a, b)
    assert instructions(other) == base
    x = jaxmg.potrs(a, b, T_A=5, pad=False)
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(a0, np.ones(N)), rtol=1e-10)
    assert repr(jaxmg.cho_factor(a, T_A=5)) == (
        f"CholeskyFactor(N={N}, T_A={N}, axis='x', form='rows', ndev=1)"
    )


def test_block_cyclic_input_keeps_the_native_engine(solo):
    """cyclic_1d=True (A in the block-cyclic layout of T_A, padded to whole tiles) is the native
    engines' layout."""
    a0 = hpd(N, np.float64)
    a_bc = jaxmg.cyclic_1d_layout(put(a0, solo, FORMS["cols"]), 5)
    assert a_bc.shape == (N, 25)
    call = jax.jit(lambda a: jaxmg.potrs(a, jnp.ones(N), 5, cyclic_1d=True))
    assert jaxmg_calls(call.lower(a_bc).compile().as_text()) == 1
    np.testing.assert_allclose(np.asarray(call(a_bc)), np.linalg.solve(a0, np.ones(N)), rtol=1e-10)


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto])
def test_mesh_kinds_and_in_specs(request, axis_type):
    """Explicit and Auto meshes; A replicated with in_specs deciding; NetKet's call (abstract
    mesh under jax.set_mesh, inside jit) with its own tile."""
    mesh = one_device_mesh(request, axis_type, "S")
    a0 = hpd(N, np.float64)
    b0 = np.arange(1.0, N + 1)
    ref = np.linalg.solve(a0, b0)
    replicated = put(a0, mesh, P())
    x = jaxmg.potrs(replicated, jnp.asarray(b0), mesh=mesh, in_specs=(P("S", None), P()))
    np.testing.assert_allclose(np.asarray(x), ref, rtol=1e-10)

    def netket(a, b):
        abstract = jax.sharding.get_abstract_mesh()
        x = jaxmg.potrs(a, b, T_A=64, mesh=abstract, in_specs=P("S", None))
        w, v = jaxmg.syevd(a, T_A=512, mesh=abstract, in_specs=(P("S", None),))
        return x, w, v

    with jax.set_mesh(mesh):
        x, w, v = jax.jit(netket)(replicated, jnp.asarray(b0))
        inv = jaxmg.potri(jnp.asarray(a0), in_specs=P(None, "S"))  # no mesh: set_mesh's
    np.testing.assert_allclose(np.asarray(x), ref, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(w), np.linalg.eigvalsh(a0), rtol=1e-10)
    np.testing.assert_allclose(a0 @ np.asarray(v), np.asarray(v) * np.asarray(w), atol=1e-10)
    np.testing.assert_allclose(np.asarray(inv), np.linalg.inv(a0), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("form", FORMS)
def test_inside_a_users_shard_map(solo, form):
    """The *_no_shardmap functions (and 0.0.x's *_shardmap_ctx on rows) in the user's own
    shard_map, which checks replication: x, w and the status are typed as replicated."""
    spec = FORMS[form]
    a0 = hpd(N, np.complex128, 4)
    b0 = random(N, np.complex128, 4, cols=2)

    def body(a, b):
        x, s1 = jaxmg.potrs_no_shardmap(a, b, sharded_by=form)
        inv, s2 = jaxmg.potri_no_shardmap(a, T_A=5, sharded_by=form)
        w, v, s3 = jaxmg.syevd_no_shardmap(a, sharded_by=form)
        w_only, s4 = jaxmg.syevd_no_shardmap(a, return_eigenvectors=False, sharded_by=form)
        return x, inv, w, v, w_only, s1 + s2 + s3 + s4

    out_specs = (P(), spec, P(), spec, P(), P())
    run = jax.jit(jax.shard_map(body, mesh=solo, in_specs=(spec, P()), out_specs=out_specs))
    assert jaxmg_calls(run.lower(put(a0, solo, spec), jnp.asarray(b0)).compile().as_text()) == 0
    x, inv, w, v, w_only, status = (np.asarray(o) for o in run(put(a0, solo, spec), b0))
    assert int(status[0]) == 0
    np.testing.assert_allclose(x, np.linalg.solve(a0, b0), rtol=1e-10)
    np.testing.assert_allclose(inv, np.linalg.inv(a0), rtol=1e-10, atol=1e-12)
    for values in (w, w_only):
        np.testing.assert_allclose(values, np.linalg.eigvalsh(a0), rtol=1e-10)
    np.testing.assert_allclose(a0 @ v, v * w, atol=1e-10 * np.abs(w).max())
    if form == "rows":
        ctx = jax.jit(
            jax.shard_map(
                lambda a, b: jaxmg.potrs_shardmap_ctx(a, b, 4),
                mesh=solo, in_specs=(spec, P()), out_specs=(P(), P()),
            )
        )  # fmt: skip
        x, status = ctx(put(a0, solo, spec), b0)
        assert int(status[0]) == 0
        np.testing.assert_allclose(np.asarray(x), np.linalg.solve(a0, b0), rtol=1e-10)


def test_vmap_is_batched_and_keeps_each_status(solo):
    """Under vmap JAX's batched solvers take the whole batch at once (one LAPACK call per
    routine in the program, on the batch), and each matrix keeps its own status and NaN."""
    mats = np.stack([hpd(N, np.float64, s) for s in range(3)])
    mats[1, 9, 9] = -5.0  # the leading minor of order 10 fails
    rhs = np.ones((3, N, 1))

    def solve(a, b):
        return jaxmg.potrs(a, b, mesh=solo, in_specs=P(None, "x"), return_status=True)

    batched = jax.jit(jax.vmap(solve))
    text = batched.lower(jnp.asarray(mats), jnp.asarray(rhs)).compile().as_text()
    assert jaxmg_calls(text) == 0
    calls = [line for line in text.splitlines() if 'custom_call_target="lapack_dpotrf' in line]
    assert calls and all(f"[3,{N},{N}]" in line for line in calls), calls
    x, status = batched(jnp.asarray(mats), jnp.asarray(rhs))
    np.testing.assert_array_equal(np.asarray(status), [0, 10, 0])
    x = np.asarray(x)
    assert np.isnan(x[1]).all()
    for k in (0, 2):
        np.testing.assert_allclose(x[k], np.linalg.solve(mats[k], rhs[k]), rtol=1e-10)


@pytest.mark.usefixtures("once_per_suite")
def test_solves_transposed_says_which_getrs_takes_a_transpose(monkeypatch):
    """What the LU programs read: cuSolverMg's getrs takes only N (issue 24), cuSOLVERMp's too;
    ScaLAPACK's and the dense engine's take N, T and C."""
    monkeypatch.setattr(jaxmg_cuda.mp, "nccl_id", lambda: np.zeros(16, np.int64))
    assert ENGINES["mg"].solves_transposed("cpu") is False
    assert ENGINES["mp"].solves_transposed("cpu") is True
    assert ENGINES["mp"].solves_transposed("gpu") is False
    for platform in ("cpu", "gpu"):
        assert ENGINES["jax"].solves_transposed(platform) is True


@pytest.mark.usefixtures("once_per_suite")
def test_one_gpu_lowers_to_jax_cusolver_calls():
    """On one GPU (an abstract one, lowered for CUDA here) the default program is JAX's own
    cuSOLVER calls, with no tile limit (no syevd warning for T_A=4096); backend="mg" is
    cuSolverMg's target."""
    mesh = jax.sharding.AbstractMesh(
        (1,), ("x",), axis_types=(AxisType.Explicit,),
        abstract_device=jax.sharding.AbstractDevice("gpu", None, "cuda"),
    )  # fmt: skip
    arg = jax.ShapeDtypeStruct((64, 64), jnp.float64, sharding=NamedSharding(mesh, FORMS["cols"]))
    b = jnp.ones(64)

    def everything(a, backend=None):
        kw = dict(mesh=mesh, backend=backend)
        w, v = jaxmg.syevd(a, 4096, **kw)
        return (jaxmg.potrs(a, b, **kw), jaxmg.potri(a, **kw), w, v,
                jaxmg.syevd(a, return_eigenvectors=False, **kw),
                jaxmg.lu_solve(a, b, trans=1, **kw))  # fmt: skip

    def targets(fn):
        text = jax.jit(fn).trace(arg).lower(lowering_platforms=("cuda",)).as_text()
        return set(re.findall(r"custom_call @(\w+)\(", text))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dense = targets(everything)
    assert dense == {
        "cusolver_potrf_ffi", "cusolver_syevd_ffi", "cusolver_getrf_ffi",
        "cu_lu_pivots_to_permutation",
    }  # fmt: skip
    if jaxmg_cuda.has_cuda_support():
        native = targets(lambda a: jaxmg.potrs(a, b, mesh=mesh, backend="mg"))
        assert native == {"jaxmg_potrs"}


# --- with several devices ----------------------------------------------------------------------


def test_axes_of_several_devices_keep_the_native_engine():
    """An axis of several devices runs the native engine; a mesh of one of them (here the last,
    not device 0) runs the dense path."""
    if jax.device_count() == 1:
        pytest.skip("needs several devices")
    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    n = 4 * mesh.size
    a0 = hpd(n, np.float64)
    a = put(a0, mesh, FORMS["cols"])
    assert engines.resolve(a).backend == "mg"
    assert jaxmg_calls(hlo(lambda a: jaxmg.potrs(a, jnp.ones(n)), a)) == 1
    last = jax.make_mesh((1,), ("x",), devices=jax.devices()[-1:])
    alone = put(a0, last, FORMS["rows"])
    assert engines.resolve(alone).backend == "jax"
    x = jaxmg.potrs(alone, jnp.ones(n))
    assert x.sharding.device_set == {jax.devices()[-1]}
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(a0, np.ones(n)), rtol=1e-10)
