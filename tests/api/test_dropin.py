"""Calls written for earlier jaxmg releases and by NetKet run unchanged, against numpy.

Each test is one way a real program calls jaxmg that an earlier version of this package
refused: an abstract mesh with Auto axes (NetKet's ``jax.sharding.get_abstract_mesh()``),
``in_specs`` that disagree with where ``A`` is, no mesh under ``jax.set_mesh``, shards
narrower than the device count, ``T_A`` left out, jaxmg 0.0.x's ``*_shardmap_ctx`` names. The
arguments that are refused instead (keyword-only positions, ``pad=False``) are in
``test_errors.py``; the same calls across processes in ``tests/multiprocess``.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from matrices import hpd, mesh_of

import jaxmg
import jaxmg_cuda
from jaxmg.engines import mg

COLS, ROWS = P(None, "x"), P("x", None)


def check_solution(A, x, b):
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(A, b), rtol=1e-10, atol=1e-12)


def check_eigh(A, w, V=None):
    w = np.asarray(w)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(A), rtol=1e-10, atol=1e-12)
    if V is not None:
        V = np.asarray(V)
        np.testing.assert_allclose(A @ V, V * w, atol=1e-10 * np.abs(w).max())


# --- NetKet: an abstract mesh under jax.set_mesh -------------------------------------------


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
@pytest.mark.parametrize("start", ["replicated", "rows", "cols"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_netket_calls(axis_type, start, jit):
    """NetKet 3.22's ``cholesky_distributed`` and ``pinv_smooth_distributed``: under the mesh
    it installs with ``jax.set_mesh`` (axis "S"), ``mesh=jax.sharding.get_abstract_mesh()``
    and ``in_specs=P("S", None)`` decide where ``A`` goes, wherever it starts."""
    mesh = mesh_of(axis_type, "S")
    n = 8 * mesh.size
    A = hpd(n)
    b = np.random.default_rng(1).standard_normal((n, 1))
    start_spec = {"replicated": P(), "rows": P("S", None), "cols": P(None, "S")}[start]

    def solve(a, b):
        x = jaxmg.potrs(
            a, b, T_A=max(64, n // mesh.size), mesh=jax.sharding.get_abstract_mesh(),
            in_specs=P("S", None),
        )  # fmt: skip
        w, V = jaxmg.syevd(
            a, T_A=min(n // mesh.size, 512), mesh=jax.sharding.get_abstract_mesh(),
            in_specs=(P("S", None),),
        )  # fmt: skip
        return x, w, V

    with jax.set_mesh(mesh):
        a = jax.device_put(A, NamedSharding(mesh, start_spec))
        x, w, V = (jax.jit(solve) if jit else solve)(a, jnp.asarray(b))
    check_solution(A, x, b)
    check_eigh(A, w, V)


def test_no_mesh_under_set_mesh():
    """With ``jax.set_mesh`` in effect, ``in_specs`` alone says where ``A`` goes."""
    mesh = mesh_of(AxisType.Auto)
    n = 6 * mesh.size
    A = hpd(n, np.complex128)
    b = np.ones(n, np.complex128)
    with jax.set_mesh(mesh):
        x = jaxmg.potrs(jnp.asarray(A), jnp.asarray(b), in_specs=ROWS)
        inv = jax.jit(lambda a: jaxmg.potri(a, in_specs=COLS))(jnp.asarray(A))
    check_solution(A, x, b)
    np.testing.assert_allclose(np.asarray(inv), np.linalg.inv(A), rtol=1e-10, atol=1e-12)


# --- in_specs decides ------------------------------------------------------------------------


def _starts(mesh, A):
    """``A`` in every place a caller may hold it before asking jaxmg for ``in_specs``."""
    yield "numpy", A
    yield "one device", jax.device_put(A, jax.devices()[-1])
    yield "replicated", jax.device_put(A, NamedSharding(mesh, P()))
    yield "other form", jax.device_put(A, NamedSharding(mesh, COLS))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_in_specs_decides_where_a_goes(jit):
    mesh = mesh_of()
    n = 4 * mesh.size
    A = hpd(n, seed=2)
    fn = lambda a: jaxmg.potri(a, 2, mesh=mesh, in_specs=(ROWS,))  # noqa: E731
    for where, a in _starts(mesh, A):
        if jit and where == "one device" and mesh.size > 1:
            continue  # jax.jit itself refuses an argument committed to other devices
        inv = jax.jit(fn)(a) if jit else fn(a)
        assert inv.sharding.spec == ROWS, where
        np.testing.assert_allclose(np.asarray(inv), np.linalg.inv(A), rtol=1e-10, atol=1e-12)


def test_in_specs_over_another_axis():
    """``A`` sharded over the axis of another mesh of the same devices, ``in_specs`` naming the
    axis of the mesh given."""
    mesh = mesh_of()
    n = 4 * mesh.size
    A = hpd(n, seed=3)
    a = jax.device_put(A, NamedSharding(mesh_of(name="y"), P("y", None)))
    x = jaxmg.potrs(a, jnp.ones(n), mesh=mesh, in_specs=(COLS, P()))
    check_solution(A, x, np.ones(n))
    x = jax.jit(lambda a: jaxmg.potrs(a, jnp.ones(n), mesh=mesh, in_specs=COLS))(a)
    check_solution(A, x, np.ones(n))


# --- every N divisible by the device count ---------------------------------------------------


@pytest.mark.parametrize("shard", [1, 5])
@pytest.mark.parametrize("relayout", ["native", "jax"])
def test_shards_narrower_than_the_device_count(shard, relayout):
    """``N = shard * ndev``: on 8 devices N=8 and N=40, both under ``ndev**2``; with a tile
    that needs a relayout (1 or 2) and one that does not (the whole shard)."""
    mesh = mesh_of()
    n = shard * mesh.size
    A = hpd(n, np.complex128, seed=n)
    b = np.arange(1, 2 * n + 1, dtype=np.complex128).reshape(n, 2)
    for spec in (COLS, ROWS):
        a = jax.device_put(A, NamedSharding(mesh, spec))
        for T_A in sorted({1, min(2, shard), shard}):
            x = jaxmg.potrs(a, jnp.asarray(b), T_A, relayout=relayout)
            check_solution(A, x, b)
            inv = jaxmg.potri(a, T_A, relayout=relayout)
            np.testing.assert_allclose(np.asarray(inv), np.linalg.inv(A), rtol=1e-9, atol=1e-12)
            check_eigh(A, *jaxmg.syevd(a, T_A, relayout=relayout))


# --- T_A chosen by jaxmg ---------------------------------------------------------------------


def test_auto_tile_rule(once_per_suite):
    """The rule docs/sharp-bits.md states, worked by hand."""
    auto = mg.auto_tile
    assert auto(4096, 4, "potrs", "cpu") == 1024  # CPU: the whole shard, no relayout
    assert auto(400000, 4, "syevd", "cpu") == 100000
    assert auto(4096, 4, "potrs", "gpu") == 1024  # shard within the cap: no relayout
    assert auto(16384, 4, "potrs", "gpu") == 4096
    assert auto(16384, 4, "syevd", "gpu") == 1024  # cuSolverMg's syevd limit
    assert auto(131072, 4, "potri", "gpu") == 4096  # 32768 = 8 x 4096
    assert auto(3 * 5000, 3, "potrs", "gpu") == 2500  # widest divisor of 5000 in [256, 4096]
    assert auto(3 * 5003, 3, "syevd", "gpu") == 1024  # 5003 is prime: the cap
    assert auto(8 * 100, 8, "syevd", "gpu") == 100  # small shards: the shard itself


@pytest.mark.parametrize("form", ["cols", "rows"])
def test_tile_left_out_in_every_routine(form):
    mesh = mesh_of()
    n = 6 * mesh.size
    A = hpd(n, seed=4)
    b = np.ones((n, 3))
    spec = COLS if form == "cols" else ROWS
    a = jax.device_put(A, NamedSharding(mesh, spec))
    check_solution(A, jaxmg.potrs(a, jnp.asarray(b)), b)
    np.testing.assert_allclose(np.asarray(jaxmg.potri(a)), np.linalg.inv(A), rtol=1e-9)
    check_eigh(A, *jaxmg.syevd(a))
    check_eigh(A, jaxmg.syevd(a, return_eigenvectors=False))

    def body(a, b):
        x, s1 = jaxmg.potrs_no_shardmap(a, b, sharded_by=form)
        inv, s2 = jaxmg.potri_no_shardmap(a, sharded_by=form)
        w, v, s3 = jaxmg.syevd_no_shardmap(a, sharded_by=form)
        return x, inv, w, v, s1 + s2 + s3

    out_specs = (P(), spec, P(), spec, P())
    run = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, P()), out_specs=out_specs))
    x, inv, w, v, status = run(a, jnp.asarray(b))
    assert int(status[0]) == 0
    check_solution(A, x, b)
    np.testing.assert_allclose(np.asarray(inv), np.linalg.inv(A), rtol=1e-9)
    check_eigh(A, w, v)


# --- syevd's tile limit on GPUs, checked by lowering for CUDA --------------------------------


def _gpu_mesh():
    if not jaxmg_cuda.has_cuda_support():
        pytest.skip("jaxmg-cuda was built without CUDA: its GPU targets cannot be lowered")
    return jax.sharding.AbstractMesh(
        (2,), ("x",), axis_types=(AxisType.Explicit,),
        abstract_device=jax.sharding.AbstractDevice("gpu", None, "cuda"),
    )  # fmt: skip


def _lowered_for_cuda(fn, n, mesh, spec):
    arg = jax.ShapeDtypeStruct((n, n), jnp.float64, sharding=NamedSharding(mesh, spec))
    return jax.jit(fn).trace(arg).lower(lowering_platforms=("cuda",)).as_text()


def test_syevd_tile_over_the_gpu_limit_is_lowered_with_a_warning(once_per_suite):
    """As jaxmg 0.0.x did (NetKet's docs ask for 4096): a warning, and the call is made with
    1024, in both entry points. The mesh is an abstract GPU mesh, lowered for CUDA here."""
    mesh = _gpu_mesh()
    n = 2 * 2048
    with pytest.warns(UserWarning, match="jaxmg.syevd: .* at most 1024; T_A=4096 is lowered"):
        text = _lowered_for_cuda(lambda a: jaxmg.syevd(a, 4096, mesh=mesh), n, mesh, COLS)
    assert "custom_call @jaxmg_syevd(" in text and "T_A = 1024 : i64" in text

    def inside(a):
        return jaxmg.syevd_no_shardmap(a, 2048, return_eigenvectors=False)

    body = jax.shard_map(inside, mesh=mesh, in_specs=COLS, out_specs=(P(), P()))
    with pytest.warns(UserWarning, match="jaxmg.syevd_no_shardmap: .*T_A=2048 is lowered"):
        text = _lowered_for_cuda(body, n, mesh, COLS)
    assert "T_A = 1024 : i64" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: the automatic tile stays within the limit
        text = _lowered_for_cuda(lambda a: jaxmg.syevd(a, mesh=mesh), n, mesh, COLS)
    assert "T_A = 1024 : i64" in text


def test_syevd_tile_is_not_lowered_on_cpu():
    """The CPU twin has no tile limit: no warning, the tile asked for."""
    mesh = mesh_of()
    n = 2 * mesh.size
    a = jax.device_put(hpd(n), NamedSharding(mesh, COLS))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_eigh(hpd(n), jaxmg.syevd(a, 4096, return_eigenvectors=False))


# --- jaxmg 0.0.x's names ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_shardmap_ctx_functions(dtype):
    """jaxmg 0.0.x's ``*_shardmap_ctx``: row blocks inside the user's shard_map, no axis name;
    ``syevd_shardmap_ctx`` returns the columns of ``V`` (out_specs ``P(None, ax)``), and
    ``potri_symmetrize`` of the inverse is the inverse."""
    mesh = mesh_of()
    n = 6 * mesh.size
    A = hpd(n, dtype, seed=5)
    b = np.arange(1, n + 1, dtype=dtype).reshape(n, 1)

    def body(a, b):
        x, s1 = jaxmg.potrs_shardmap_ctx(a, b, 4)
        inv, s2 = jaxmg.potri_shardmap_ctx(a, 4)
        w, v, s3 = jaxmg.syevd_shardmap_ctx(a, 4)
        w_only, s4 = jaxmg.syevd_shardmap_ctx(a, 4, False)
        return x, inv, w, v, w_only, s1 + s2 + s3 + s4

    run = jax.jit(
        jax.shard_map(
            body, mesh=mesh, in_specs=(ROWS, P()), out_specs=(P(), ROWS, P(), COLS, P(), P())
        )
    )
    x, inv, w, v, w_only, status = run(jax.device_put(A, NamedSharding(mesh, ROWS)), b)
    assert int(status[0]) == 0
    check_solution(A, x, b)
    np.testing.assert_allclose(np.asarray(inv), np.linalg.inv(A), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(jaxmg.potri_symmetrize(inv)), np.asarray(inv))
    check_eigh(A, w, v)
    check_eigh(A, w_only)


def test_potri_symmetrize_fills_from_the_upper_triangle(once_per_suite):
    n = 5
    upper = np.triu(np.arange(1, n * n + 1, dtype=np.complex128).reshape(n, n) * (1 + 1j))
    out = np.asarray(jaxmg.potri_symmetrize(jnp.asarray(upper)))
    expected = upper + np.triu(upper, 1).conj().T
    np.testing.assert_array_equal(out, expected)


def test_top_level_status_is_a_scalar():
    """As in jaxmg 0.0.x, ``int(status)`` works; inside shard_map it stays ``[1]``."""
    mesh = mesh_of()
    n = 2 * mesh.size
    a = jax.device_put(hpd(n), NamedSharding(mesh, COLS))
    _, status = jaxmg.potrs(a, jnp.ones(n), return_status=True)
    _, s2 = jaxmg.potri(a, return_status=True)
    *_, s3 = jaxmg.syevd(a, return_status=True)
    assert [s.shape for s in (status, s2, s3)] == [(), (), ()]
    assert int(status) == int(s2) == int(s3) == 0
