"""Programs written for jaxmg 1.x (cuSOLVERMp; NetKet 3.23 calls it), unchanged.

Written from jaxmg 1.4.1's signatures and docstrings: every routine is ``f(a, [b,] T_A,
mesh=None, matrix_specs=None, *, in_specs=None, return_status=False, pad=True, donate=True,
...)`` with a ``*_shardmap_ctx`` twin on global arrays that keeps its inputs and returns its
status always (and, for potrs, syevd, lu_solve, gesvd and least_squares, a work buffer first).
Each call is checked against numpy, eagerly and under ``jit``, in its positional and keyword
forms; the calls that meant something else in jaxmg before (``gesvd(a, T_A)``, ``qr(a, T_A)``,
``polar(a, T_A)``, ``lstsq(a, b, T_A)``) each have a test.
"""

import ctypes.util
import importlib.metadata

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from matrices import hpd, mesh_of

import jaxmg

TOL = dict(rtol=1e-9, atol=1e-11)
#: 1.x's status words: 0 is the status code; the routine's info (potrs: potrf's) at 27.
CODE, POTRF_INFO, SYEVD_INFO = 0, 27, 24


def general(m, n, seed=1):
    return np.random.default_rng(seed).standard_normal((m, n))


def rows(a, mesh):
    return jax.device_put(a, NamedSharding(mesh, P("x", None)))


def size():
    return 4 * jax.device_count()


def run(f, jit, *args):
    return jax.jit(f)(*args) if jit else f(*args)


def status_words(status, words):
    """1.x's status: one block of ``words`` per process, the same block in each here."""
    status = np.asarray(status)
    assert status.dtype == np.int32 and status.shape == (jax.device_count() * words,)
    blocks = status.reshape(jax.device_count(), words)
    assert (blocks == blocks[0]).all()
    return blocks[0]


# --- the solvers: potrs, syevd, lu_solve, least_squares ------------------------------------------


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_potrs_forms(jit):
    mesh = mesh_of()
    n = size()
    a_host, b_host = hpd(n), general(n, 2)
    want = np.linalg.solve(a_host, b_host)
    A, b = rows(a_host, mesh), jnp.asarray(b_host)
    np.testing.assert_allclose(run(lambda A, b: jaxmg.potrs(A, b, 4), jit, A, b), want, **TOL)
    x = run(lambda A, b: jaxmg.potrs(A, b, 4, mesh, P("x", None)), jit, A, b)
    np.testing.assert_allclose(x, want, **TOL)
    x, logdet, status = run(
        lambda A, b: jaxmg.potrs(
            A, b, 4, matrix_specs=P("x"), return_logdet=True, return_status=True
        ),
        jit,
        A,
        b,
    )
    np.testing.assert_allclose(x, want, **TOL)
    np.testing.assert_allclose(logdet, np.linalg.slogdet(a_host)[1], rtol=1e-12)
    words = status_words(status, 40)
    assert words[CODE] == 0 and words[POTRF_INFO] == 0
    assert (words[4], words[5], words[13], words[14]) == (jax.device_count(), 1, n, 4)
    # in_specs= is 1.x's alias of matrix_specs=; both at once is refused
    x = run(lambda A, b: jaxmg.potrs(A, b, 4, in_specs=(P("x", None),)), jit, A, b)
    np.testing.assert_allclose(x, want, **TOL)
    with pytest.raises(ValueError, match="not both"):
        jaxmg.potrs(A, b, 4, in_specs=P("x"), matrix_specs=P("x"))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_potrs_shardmap_ctx_on_global_arrays(jit):
    """1.x's ctx twin, as NetKet 3.23 calls it: global arrays, no mesh, ``(a_work, x,
    status)``, ``A`` and ``b`` kept; a matrix that is not positive definite gives NaN and
    1.x's status code (kPotrfInfoNonzero, 27) with potrf's info."""
    mesh = mesh_of(AxisType.Auto)
    n = size()
    a_host, b_host = hpd(n), general(n, 1)[:, 0]
    with jax.set_mesh(mesh):
        A, b = jnp.asarray(a_host), jnp.asarray(b_host)  # replicated: 1.x takes rows
        a_work, x, status = run(lambda A, b: jaxmg.potrs_shardmap_ctx(A, b, T_A=4), jit, A, b)
        np.testing.assert_allclose(x, np.linalg.solve(a_host, b_host), **TOL)
        assert x.shape == (n,) and not A.is_deleted() and not b.is_deleted()
        np.testing.assert_array_equal(a_work, a_host)
        assert status_words(status, 40)[CODE] == 0
        out = run(lambda A, b: jaxmg.potrs_shardmap_ctx(A, b, 4, return_logdet=True), jit, A, b)
        assert len(out) == 4
        np.testing.assert_allclose(out[2], np.linalg.slogdet(a_host)[1], rtol=1e-12)
        bad = a_host.copy()
        bad[2, 2] = -1.0
        _, x, status = run(lambda A, b: jaxmg.potrs_shardmap_ctx(A, b, 4), jit, jnp.asarray(bad), b)
    assert np.isnan(np.asarray(x)).all()
    words = status_words(status, 40)
    assert words[CODE] == 27 and words[POTRF_INFO] == 3


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_syevd_forms(jit):
    mesh = mesh_of()
    n = size()
    a_host = hpd(n)
    w_ref = np.linalg.eigvalsh(a_host)
    A = rows(a_host, mesh)
    w, v = run(lambda A: jaxmg.syevd(A, 4), jit, A)
    np.testing.assert_allclose(w, w_ref, **TOL)
    np.testing.assert_allclose(a_host @ np.asarray(v), np.asarray(v) * w_ref, atol=1e-10)
    w, status = run(
        lambda A: jaxmg.syevd(
            A, 4, mesh, P("x", None), return_eigenvectors=False, return_status=True
        ),
        jit,
        A,
    )
    np.testing.assert_allclose(w, w_ref, **TOL)
    assert np.asarray(status).shape == ()  # jaxmg's scalar: the call could be either generation
    w, status = run(
        lambda A: jaxmg.syevd(
            A, 4, matrix_specs=P("x"), return_eigenvectors=False, return_status=True
        ),
        jit,
        A,
    )
    assert status_words(status, 36)[SYEVD_INFO] == 0
    a_work, w, v, status = run(lambda A: jaxmg.syevd_shardmap_ctx(A, T_A=4), jit, A)
    np.testing.assert_allclose(w, w_ref, **TOL)
    assert v.shape == (n, n) and not A.is_deleted() and status_words(status, 36)[CODE] == 0
    out = run(lambda A: jaxmg.syevd_shardmap_ctx(A, 4, return_eigenvectors=False), jit, A)
    assert len(out) == 3
    np.testing.assert_allclose(out[1], w_ref, **TOL)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_lu_solve_forms(jit):
    mesh = mesh_of()
    n = size()
    a_host, b_host = general(n, n) + n * np.eye(n), general(n, 3, seed=2)
    want = np.linalg.solve(a_host, b_host)
    A, b = rows(a_host, mesh), jnp.asarray(b_host)
    np.testing.assert_allclose(run(lambda A, b: jaxmg.lu_solve(A, b, 4), jit, A, b), want, **TOL)
    x, status = run(
        lambda A, b: jaxmg.lu_solve(A, b, 4, mesh, matrix_specs=P("x"), return_status=True),
        jit,
        A,
        b,
    )
    np.testing.assert_allclose(x, want, **TOL)
    words = status_words(status, 41)
    assert words[CODE] == 0 and words[36] == 3  # nrhs
    a_work, x, status = run(lambda A, b: jaxmg.lu_solve_shardmap_ctx(A, b, 4), jit, A, b)
    np.testing.assert_allclose(x, want, **TOL)
    assert not A.is_deleted() and status_words(status, 41)[CODE] == 0


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_least_squares(jit):
    mesh = mesh_of()
    m, n = 2 * size(), size()
    a_host, b_host = general(m, n), general(m, 1, seed=3)[:, 0]
    want = np.linalg.lstsq(a_host, b_host, rcond=None)[0]
    A, b = rows(a_host, mesh), jnp.asarray(b_host)
    np.testing.assert_allclose(
        run(lambda A, b: jaxmg.least_squares(A, b, 4), jit, A, b), want, **TOL
    )
    x, status = run(lambda A, b: jaxmg.least_squares(A, b, 4, return_status=True), jit, A, b)
    np.testing.assert_allclose(x, want, **TOL)
    assert status_words(status, 35)[CODE] == 0
    a_work, b_work, x, status = run(
        lambda A, b: jaxmg.least_squares_shardmap_ctx(A, b, 4), jit, A, b
    )
    np.testing.assert_allclose(x, want, **TOL)
    assert b_work.shape == (m,)
    np.testing.assert_allclose(np.asarray(b_work)[:n], want, **TOL)  # 1.x: x in its first N rows
    with pytest.raises(ValueError, match="takes M >= N.*jaxmg.lstsq"):
        jaxmg.least_squares(rows(a_host.T.copy(), mesh), jnp.ones(n), 4)


# --- the decompositions: gesvd, qr, polar --------------------------------------------------------


def check_svd(a_host, u, s, vh):
    np.testing.assert_allclose(s, np.linalg.svd(a_host, compute_uv=False), **TOL)
    if u is not None and vh is not None:
        np.testing.assert_allclose((np.asarray(u) * np.asarray(s)) @ np.asarray(vh), a_host, **TOL)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_gesvd_takes_t_a_second(jit):
    """``gesvd(a, T_A)`` is 1.x's: the reduced SVD (``U`` ``[M, K]``). Before, ``gesvd`` was
    ``svd``, whose second argument is ``full_matrices``: ``U`` came back ``[M, M]``."""
    mesh = mesh_of()
    m, n = 2 * size(), size()
    a_host = general(m, n)
    A = rows(a_host, mesh)
    u, s, vh = run(lambda A: jaxmg.gesvd(A, 8), jit, A)
    assert u.shape == (m, n) and vh.shape == (n, n)
    check_svd(a_host, u, s, vh)
    u, s = run(lambda A: jaxmg.gesvd(A, 8, compute_vh=False), jit, A)
    assert u.shape == (m, n)
    s, vh = run(lambda A: jaxmg.gesvd(A, 8, mesh, P("x", None), compute_u=False), jit, A)
    assert vh.shape == (n, n)
    s, status = run(
        lambda A: jaxmg.gesvd(A, 8, compute_u=False, compute_vh=False, return_status=True), jit, A
    )
    check_svd(a_host, None, s, None)
    words = status_words(status, 42)
    assert words[CODE] == 0 and (words[13], words[14], words[15]) == (m, n, 8)
    u, s, vh = run(lambda A: jaxmg.gesvd(A, 8, full_matrices=True), jit, A)
    assert u.shape == (m, m)
    a_work, u, s, vh, status = run(lambda A: jaxmg.gesvd_shardmap_ctx(A, 8), jit, A)
    check_svd(a_host, u, s, vh)
    assert not A.is_deleted() and status_words(status, 42)[CODE] == 0
    assert len(run(lambda A: jaxmg.gesvd_shardmap_ctx(A, 8, compute_u=False), jit, A)) == 4


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_qr_and_polar_take_t_a_second(jit):
    """``qr(a, T_A)`` and ``polar(a, T_A)`` are 1.x's (before, ``mode`` and ``side`` were
    second, and both calls raised); their numpy-style options are keywords."""
    mesh = mesh_of()
    m, n = 2 * size(), size()
    a_host = general(m, n)
    A = rows(a_host, mesh)
    q, r = run(lambda A: jaxmg.qr(A, 8), jit, A)
    np.testing.assert_allclose(np.asarray(q) @ np.asarray(r), a_host, **TOL)
    np.testing.assert_allclose(np.asarray(q).T @ np.asarray(q), np.eye(n), atol=1e-12)
    r_only = run(lambda A: jaxmg.qr(A, 8, mesh, P("x", None), mode="r"), jit, A)
    np.testing.assert_allclose(r_only, r, **TOL)
    q, r, status = run(lambda A: jaxmg.qr_shardmap_ctx(A, 8), jit, A)
    np.testing.assert_allclose(np.asarray(q) @ np.asarray(r), a_host, **TOL)
    assert status_words(status, 36)[CODE] == 0

    up, h = run(lambda A: jaxmg.polar(A, 8), jit, A)
    np.testing.assert_allclose(np.asarray(up) @ np.asarray(h), a_host, **TOL)
    up_only = run(lambda A: jaxmg.polar(A, 8, compute_h=False), jit, A)
    np.testing.assert_allclose(up_only, up, **TOL)
    up, h, status = run(
        lambda A: jaxmg.polar(A, 8, matrix_specs=P("x"), return_status=True), jit, A
    )
    assert status_words(status, 32)[CODE] == 0 and h.shape == (n, n)
    up, status = run(lambda A: jaxmg.polar_shardmap_ctx(A, 8, compute_h=False), jit, A)
    np.testing.assert_allclose(up, up_only, **TOL)
    assert not A.is_deleted()

    with pytest.raises(TypeError, match="mode='r'"):
        jaxmg.qr(A, "r")
    with pytest.raises(TypeError, match="keyword-only"):
        jaxmg.polar(A, 8, None, None, "left")


def test_lstsq_keeps_numpys_meaning_and_refuses_a_tile_as_rcond():
    """``lstsq(a, b, rcond)`` is numpy's; an ``rcond`` of 1 or more drops every singular value
    (before, ``lstsq(a, b, 16)`` returned 0 with rank 0): refused, naming least_squares."""
    mesh = mesh_of()
    m, n = 2 * size(), size()
    a_host, b_host = general(m, n), general(m, 1, seed=4)[:, 0]
    A, b = rows(a_host, mesh), jnp.asarray(b_host)
    x, _, rank, _ = jaxmg.lstsq(A, b, 1e-10)
    np.testing.assert_allclose(x, np.linalg.lstsq(a_host, b_host, rcond=None)[0], **TOL)
    assert int(rank) == n
    with pytest.raises(ValueError, match="rcond=16 counts every singular value.*least_squares"):
        jaxmg.lstsq(A, b, 16)


# --- donation, the two generations of *_shardmap_ctx, the module's names --------------------------


def test_donation():
    """jaxmg keeps ``A`` and ``b`` unless ``donate=True`` (1.x's default is True: a 1.x
    program that passes nothing keeps its arrays, and uses more memory); ``donate=True``
    gives them up as in 1.x; the ``*_shardmap_ctx`` functions never take them."""
    mesh = mesh_of()
    n = size()
    a_host = hpd(n)
    for call in (
        lambda A, b, **kw: jaxmg.potrs(A, b, 4, **kw),
        lambda A, b, **kw: jaxmg.lu_solve(A, b, 4, **kw),
        lambda A, b, **kw: jaxmg.least_squares(A, b, 4, **kw),
        lambda A, b, **kw: jaxmg.qr(A, 8, **kw),
        lambda A, b, **kw: jaxmg.polar(A, 8, **kw),
        lambda A, b, **kw: jaxmg.gesvd(A, 8, **kw),
    ):
        A, b = rows(a_host, mesh), jnp.ones(n)
        call(A, b)
        assert not A.is_deleted()
        call(A, b, donate=True)
        assert A.is_deleted()


def test_shardmap_ctx_generations():
    """Inside ``jax.shard_map`` the ``*_shardmap_ctx`` names are jaxmg 0.0.x's (local row
    blocks, ``(x, status)``); on global arrays 1.x's. 0.0.x's fourth argument ``pad`` given
    on global arrays, where 1.x's is ``mesh``, is refused, not read as a mesh."""
    mesh = mesh_of()
    n = size()
    a_host, b_host = hpd(n), general(n, 1)[:, 0]
    A = rows(a_host, mesh)

    def local(a, b):
        return jaxmg.potrs_shardmap_ctx(a, b, 4, True)

    x, status = jax.shard_map(local, mesh=mesh, in_specs=(P("x", None), P()), out_specs=(P(), P()))(
        A, jnp.asarray(b_host)
    )
    np.testing.assert_allclose(x, np.linalg.solve(a_host, b_host), **TOL)
    assert np.asarray(status).shape == (1,)
    with pytest.raises(TypeError, match="fourth argument is mesh"):
        jaxmg.potrs_shardmap_ctx(A, jnp.asarray(b_host), 4, True)
    with pytest.raises(TypeError, match="fourth argument is mesh"):
        jaxmg.syevd_shardmap_ctx(A, 4, False)


def test_process_grid_meshes_of_one_process():
    """NetKet 3.23's ``process_grid=(n, 1)`` and ``(1, n)``: ``A`` sharded ``P(rows, cols)``
    over a 2D mesh with one axis of one device, entered with ``use_abstract_mesh``, eagerly
    and under ``jit`` inside an enclosing ``jax.set_mesh``."""
    n = size()
    a_host, b_host = hpd(n), general(n, 1)[:, 0]
    want = np.linalg.solve(a_host, b_host)
    outer = mesh_of(AxisType.Auto)
    for grid in ((jax.device_count(), 1), (1, jax.device_count())):
        mesh = jax.make_mesh(grid, ("r", "c"), axis_types=(AxisType.Auto,) * 2)

        def solve(a, b, mesh=mesh):
            a = jax.device_put(a, NamedSharding(mesh, P("r", "c")))
            b = jax.device_put(b, NamedSharding(mesh, P()))
            with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
                _, x, _ = jaxmg.potrs_shardmap_ctx(a, b, T_A=4)
                return jax.lax.with_sharding_constraint(x, P())

        with jax.set_mesh(outer):
            for jit in (False, True):
                x = run(solve, jit, jnp.asarray(a_host), jnp.asarray(b_host))
                np.testing.assert_allclose(x, want, **TOL, err_msg=f"{grid} jit={jit}")


@pytest.mark.usefixtures("once_per_suite")
def test_module_names_and_version():
    """Every name 1.x exports is here; no module ``__version__`` (NetKet 3.22 accepts only
    ``[0.0.9, 1.0)``, NetKet 3.23 only ``>= 1.4.1``, and both skip the check without one), the
    installed version from the package metadata."""
    names = (
        "gesvd gesvd_shardmap_ctx lu_solve lu_solve_shardmap_ctx least_squares "
        "least_squares_shardmap_ctx potrs potrs_shardmap_ctx polar polar_shardmap_ctx qr "
        "qr_shardmap_ctx syevd syevd_shardmap_ctx device_supports_vmm"
    ).split()
    assert all(callable(getattr(jaxmg, name)) for name in names)
    assert not hasattr(jaxmg, "__version__")
    assert importlib.metadata.version("jaxmg")
    if ctypes.util.find_library("cuda") is None:
        with pytest.raises(RuntimeError, match="libcuda.so.1"):
            jaxmg.device_supports_vmm()


def test_derivatives_of_the_1x_names():
    """``least_squares``, ``gesvd`` and the ``*_shardmap_ctx`` twins are differentiable, as the
    routines they run: their gradients match JAX's dense ones (under ``jit``)."""
    mesh = mesh_of()
    m, n = 2 * size(), size()
    a_host, b_host = general(m, n), general(m, 1, seed=5)[:, 0]
    A, b = rows(a_host, mesh), jnp.asarray(b_host)

    def theirs(f):
        return jax.jit(jax.grad(f))(jnp.asarray(a_host))

    def ours(f):
        return jax.jit(jax.grad(f))(A)

    np.testing.assert_allclose(
        ours(lambda A: jnp.sum(jaxmg.least_squares(A, b, 4) ** 2)),
        theirs(lambda A: jnp.sum(jnp.linalg.lstsq(A, b)[0] ** 2)),
        rtol=1e-8,
        atol=1e-10,
    )
    np.testing.assert_allclose(
        ours(lambda A: jnp.sum(jaxmg.gesvd(A, 8, compute_u=False, compute_vh=False))),
        theirs(lambda A: jnp.sum(jnp.linalg.svd(A, compute_uv=False))),
        rtol=1e-8,
        atol=1e-10,
    )
    spd = hpd(n)
    S = rows(spd, mesh)
    grad = jax.jit(jax.grad(lambda S: jnp.sum(jaxmg.potrs_shardmap_ctx(S, b[:n], 4)[1])))(S)
    want = jax.jit(jax.grad(lambda S: jnp.sum(jnp.linalg.solve((S + S.T) / 2, b[:n]))))(
        jnp.asarray(spd)
    )
    np.testing.assert_allclose(grad, want, rtol=1e-8, atol=1e-10)
