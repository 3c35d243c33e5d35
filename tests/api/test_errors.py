"""Bad input raises before any device work, naming the argument, what it got, what is accepted."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxmg


@pytest.fixture
def mesh():
    return jax.make_mesh((jax.device_count(),), ("x",))


@pytest.fixture
def a(mesh):
    n = 12 * mesh.size
    return jax.device_put(jnp.eye(n), NamedSharding(mesh, P(None, "x")))


def test_non_square(mesh):
    a = jax.device_put(jnp.ones((8 * mesh.size, 4 * mesh.size)), NamedSharding(mesh, P(None, "x")))
    with pytest.raises(ValueError, match=r"jaxmg.potrs: A must be square \[N, N\]"):
        jaxmg.potrs(a, jnp.ones(8 * mesh.size), 2)


def test_not_2d(mesh):
    with pytest.raises(ValueError, match="must be 2-D"):
        jaxmg.potri(jnp.ones(4), 2)


def test_b_wrong_rows(a):
    with pytest.raises(
        ValueError, match=r"b must have shape \[\d+\] or \[\d+, nrhs\].*got \(5, 1\)"
    ):
        jaxmg.potrs(a, jnp.ones((5, 1)), 2)


def test_mismatched_dtypes(a):
    with pytest.raises(TypeError, match="b has dtype float32 but A has float64"):
        jaxmg.potrs(a, jnp.ones(a.shape[0], jnp.float32), 2)


def test_integer_dtype(mesh):
    a = jax.device_put(jnp.eye(4 * mesh.size, dtype=jnp.int32), NamedSharding(mesh, P(None, "x")))
    with pytest.raises(TypeError, match="dtype int32; accepted: float32, float64, complex64"):
        jaxmg.syevd(a, 2)


@pytest.mark.parametrize("T_A", [0, -3])
def test_nonpositive_tile(a, T_A):
    with pytest.raises(ValueError, match=f"T_A must be a positive int or None .*, got {T_A}"):
        jaxmg.potri(a, T_A)


@pytest.mark.parametrize("relayout", ["xla", None, "NATIVE"])
def test_unknown_relayout(a, relayout):
    with pytest.raises(ValueError, match=f"relayout must be 'native'.* or 'jax'.*got {relayout!r}"):
        jaxmg.potrs(a, jnp.ones(a.shape[0]), 4, relayout=relayout)


@pytest.mark.parametrize("backend", ["cusolvermp", "MG", 1])
def test_unknown_backend(a, backend):
    with pytest.raises(
        ValueError, match=f"backend must be 'mg' .* 'mp' .* or None .*got {backend!r}"
    ):
        jaxmg.potrs(a, jnp.ones(a.shape[0]), backend=backend)


@pytest.mark.parametrize(
    "call",
    [
        lambda a: jaxmg.potrs(a, jnp.ones(a.shape[0]), backend="mp"),
        lambda a: jaxmg.syevd(a, backend="mp"),
        lambda a: jaxmg.lu_factor(a, backend="mp"),
    ],
)
def test_mp_needs_one_process_per_device(a, call):
    """Backend 'mp' in one process: refused with the launch that would work (the engine itself
    is tested under mpiexec in tests/mpi)."""
    if jax.device_count() == 1:
        pytest.skip("one device in one process is a valid one-process-per-device job")
    with pytest.raises(ValueError, match=r"backend='mp' runs one process per device.*mpiexec -n P"):
        call(a)


def test_automatic_backend_in_one_process(a):
    """One process: "mg" on an axis of several devices, JAX's own dense solvers ("jax") on an
    axis of one (tests/api/test_dense.py)."""
    x = jaxmg.potrs(a, jnp.ones(a.shape[0]), backend=None)
    np.testing.assert_allclose(np.asarray(x), np.ones(a.shape[0]))
    mesh = a.sharding.mesh
    expected = "jax" if mesh.size == 1 else "mg"
    assert jaxmg.engines.choose(None, mesh, "x", "cpu").name == expected
    assert jaxmg.engines.choose(None, mesh, "x", "cpu", cyclic=True).name == "mg"


@pytest.mark.parametrize("T_A", [2.0, True, "4"])
def test_non_integer_tile(a, T_A):
    with pytest.raises(TypeError, match="T_A must be a positive int"):
        jaxmg.potri(a, T_A)


def test_two_axis_sharding(mesh):
    if mesh.size < 4 or mesh.size % 2:
        pytest.skip("needs an even number of at least 4 devices")
    mesh2 = jax.make_mesh((2, mesh.size // 2), ("a", "b"))
    a = jax.device_put(jnp.eye(4 * mesh.size), NamedSharding(mesh2, P(("a", "b"), None)))
    with pytest.raises(ValueError, match=r"jaxmg accepts A sharded over exactly one mesh axis"):
        jaxmg.potri(a, 2)


def test_process_grid_needs_backend_mp_and_a_process_per_device(mesh):
    """``P(r, c)`` is the 2D block-cyclic path of backend 'mp' (run under mpiexec in tests/mpi):
    in one process it is refused with what would work."""
    if mesh.size < 4 or mesh.size % 2:
        pytest.skip("needs an even number of at least 4 devices")
    mesh2 = jax.make_mesh((2, mesh.size // 2), ("a", "b"))
    a = jax.device_put(jnp.eye(4 * mesh.size), NamedSharding(mesh2, P("a", "b")))
    with pytest.raises(ValueError, match=r"process grid P\('a', 'b'\).* only backend='mp'"):
        jaxmg.potri(a, 2, backend="mg")
    with pytest.raises(
        ValueError, match=r"backend='mp' runs one process per device.*mesh axes 'a' x 'b'"
    ):
        jaxmg.potrs(a, jnp.ones(4 * mesh.size))


def test_replicated_matrix_without_in_specs(mesh):
    """A replicated A is solved as jaxmg 1.x solves it: by rows of the one axis of its mesh;
    over a mesh of three axes nothing says where it goes."""
    n = 4 * mesh.size
    a_host = np.diag(np.arange(1.0, n + 1))
    a = jax.device_put(a_host, NamedSharding(mesh, P()))
    np.testing.assert_allclose(np.asarray(jaxmg.potri(a, 2)), np.linalg.inv(a_host), rtol=1e-14)
    mesh3 = jax.make_mesh((mesh.size, 1, 1), ("a", "b", "c"))
    a3 = jax.device_put(a_host, NamedSharding(mesh3, P()))
    with pytest.raises(
        ValueError, match=r"cannot find how to shard A: it is replicated, and its mesh has 3 axes"
    ):
        jaxmg.potri(a3, 2)


@pytest.mark.parametrize(
    "in_specs, pattern",
    [
        (12345, "in_specs must be a PartitionSpec or a tuple of up to 2 .* got 12345 of type int"),
        ("x", "in_specs must be a PartitionSpec .* got 'x' of type str"),
        ((P(None, "x"), P(), P()), "tuple of up to 2 of them"),
        ((None, P()), "in_specs entry for A must be a jax.sharding.PartitionSpec, got None"),
        ((P(None, "x"), "x"), "in_specs entry for b must be .* got 'x' of type str"),
    ],
)
def test_in_specs_of_the_wrong_type(a, mesh, in_specs, pattern):
    with pytest.raises(TypeError, match=pattern):
        jaxmg.potrs(a, jnp.ones(a.shape[0]), 2, mesh=mesh, in_specs=in_specs)


def test_in_specs_naming_an_axis_the_mesh_lacks(a, mesh):
    with pytest.raises(ValueError, match=r"mesh axis 'y' is not in the mesh axes \('x',\)"):
        jaxmg.potri(a, 2, mesh=mesh, in_specs=P(None, "y"))
    with pytest.raises(ValueError, match=r"in_specs\[1\] \(b\) .* no axis 'y'"):
        jaxmg.potrs(a, jnp.ones(a.shape[0]), 2, mesh=mesh, in_specs=(P(None, "x"), P("y")))


@pytest.mark.usefixtures("once_per_suite")
def test_plain_array_without_mesh():
    with pytest.raises(ValueError, match="no jax.set_mesh is in effect: pass mesh="):
        jax.jit(lambda x: jaxmg.potri(x, 2))(np.eye(8))


def test_mesh_that_is_not_a_mesh(a):
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh or AbstractMesh, got"):
        jaxmg.potri(a, 2, mesh="x", in_specs=P(None, "x"))


def test_empty_abstract_mesh(a):
    """jax.sharding.get_abstract_mesh() outside jax.set_mesh is empty: said so, with the fix."""
    with pytest.raises(ValueError, match="empty AbstractMesh .*jax.set_mesh"):
        jaxmg.potri(a, 2, mesh=jax.sharding.get_abstract_mesh(), in_specs=P(None, "x"))


def test_abstract_mesh_with_no_devices_known(mesh):
    """An abstract mesh that neither A nor jax.set_mesh makes concrete cannot be run on."""
    other = jax.make_mesh((mesh.size,), ("x",), axis_types=(AxisType.Auto,))
    with pytest.raises(ValueError, match="is abstract and no concrete mesh with its devices"):
        jaxmg.potri(np.eye(4 * mesh.size), 2, mesh=other.abstract_mesh, in_specs=P(None, "x"))


@pytest.mark.parametrize(
    "call, keyword",
    [
        (lambda A, b, m: jaxmg.potrs(A, b, 2, m, P(None, "x"), True), "return_status"),
        (lambda A, b, m: jaxmg.potri(A, 2, m, P(None, "x"), True), "return_status"),
        (lambda A, b, m: jaxmg.syevd(A, 2, m, P(None, "x"), False), "return_eigenvectors"),
        (lambda A, b, m: jaxmg.potrs_no_shardmap(A, b, 2, True), "cyclic_1d"),
    ],
)
def test_arguments_after_in_specs_are_keyword_only(a, mesh, call, keyword):
    """jaxmg 0.0.x put return_status (or return_eigenvectors) sixth; the original README put
    cyclic_1d there: a positional call written for either fails, naming the keyword, instead of
    silently meaning something else."""
    with pytest.raises(TypeError, match=f"keyword-only.*{keyword}"):
        call(a, jnp.ones(a.shape[0]), mesh)


def test_pad_false_refuses_a_tile_that_widens_the_blocks(a, mesh):
    """On the native engine (on one device JAX's dense solvers take A whole whatever T_A:
    nothing is widened there, tests/api/test_dense.py)."""
    s = a.shape[0] // mesh.size  # 12
    with pytest.raises(ValueError, match=r"pad=False, but T_A=5 does not divide the 12 .*\(2, 3, "):
        jaxmg.potri(a, 5, pad=False, backend="mg")
    with pytest.raises(TypeError, match="pad must be True or False, got 'no'"):
        jaxmg.potri(a, 4, pad="no")
    with pytest.raises(ValueError, match="pre-padded shards .*pad=False.* are not accepted"):
        jaxmg.potri(jnp.ones((a.shape[0] + mesh.size, a.shape[0])), 5, pad=False)
    assert jaxmg.potri(a, 4, pad=False, backend="mg").shape == a.shape  # 4 divides 12
    assert jaxmg.potri(a, s + 1, pad=False, backend="mg").shape == a.shape  # one tile per device


def test_auto_tile_needs_the_layout_of_cyclic_input(a):
    with pytest.raises(ValueError, match="with cyclic_1d=True pass the T_A that A was laid out"):
        jaxmg.potri(a, cyclic_1d=True)


def test_n_not_divisible(mesh):
    if mesh.size < 2:
        pytest.skip("every N divides over one device")
    with pytest.raises(ValueError):
        jax.device_put(jnp.eye(4 * mesh.size + 1), NamedSharding(mesh, P(None, "x")))


@pytest.mark.usefixtures("once_per_suite")
def test_more_than_16_gpus_is_refused():
    from jaxmg.engines import mg

    with pytest.raises(ValueError, match="17 GPUs .* cuSolverMg accepts at most 16"):
        mg.check_device_count(17, "gpu", "x")
    mg.check_device_count(16, "gpu", "x")
    mg.check_device_count(17, "cpu", "x")  # the CPU twin has no such limit


def test_cyclic_wrong_shape(a, mesh):
    shard = a.shape[1] // mesh.size
    valid = jaxmg.calculate_all_valid_T_A(shard, mesh.size, shard)
    widening = [t for t in valid if shard % t]
    if not widening:
        pytest.skip(f"no valid tile size pads a shard of {shard} on {mesh.size} devices")
    with pytest.raises(ValueError, match="with cyclic_1d=True, A must already be"):
        jaxmg.potrs(a, jnp.ones(a.shape[0]), widening[0], cyclic_1d=True)


@pytest.mark.usefixtures("once_per_suite")
def test_which_processes_drive_the_axis():
    """One process for the whole axis, or one device per process on one host; anything else
    is refused at call time with what was found, never attempted."""
    from jaxmg.describe import processes as _processes

    assert _processes.classify([0, 0, 0, 0], "x") == "single"
    assert _processes.classify([0, 1, 2, 3], "x") == "multi"
    assert _processes.classify([3, 1, 0, 2], "x") == "multi"
    _processes.check_one_host([3, 1, 0, 2], [7, 7, 7, 7], "x")
    _processes.check_one_host([0, 2], [7, 8, 7], "x")  # only the axis's processes count
    with pytest.raises(ValueError, match=r"spans 2 processes holding \{0: 2, 1: 2\}"):
        _processes.classify([0, 0, 1, 1], "x")
    with pytest.raises(ValueError, match="several hosts.*gather_to_hosts"):
        _processes.check_one_host([0, 1], [7, 8], "x")
    with pytest.raises(ValueError, match="holds devices in 2 slices"):
        _processes.local_slice(np.zeros((2, 2), np.int64), 0, "x", {"r": 2, "x": 2})
    assert _processes.local_slice(np.array([[0, 0], [1, 1]]), 1, "x", {"r": 2, "x": 2}) == 1
    assert _processes.local_slice(np.array([[0, 1]]), 1, "x", {"x": 2}) == 0


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.parametrize("value", [None, "0", "yes"])
def test_gpu_multiprocess_is_opt_in_until_run_on_hardware(monkeypatch, value):
    """One GPU per process (CUDA IPC) has not yet run on GPU hardware: refused unless
    JAXMG_GPU_MULTIPROCESS=1, with how to opt in and the alternative."""
    from jaxmg.describe import processes as _processes

    if value is None:
        monkeypatch.delenv(_processes.GPU_MULTIPROCESS_ENV, raising=False)
    else:
        monkeypatch.setenv(_processes.GPU_MULTIPROCESS_ENV, value)
    with pytest.raises(NotImplementedError, match="JAXMG_GPU_MULTIPROCESS=1.*drives all of its"):
        _processes.check_gpu_multiprocess_enabled("x")
    monkeypatch.setenv(_processes.GPU_MULTIPROCESS_ENV, "1")
    _processes.check_gpu_multiprocess_enabled("x")


@pytest.mark.usefixtures("once_per_suite")
def test_gpu_multiprocess_needs_every_gpu_visible():
    """A per-process CUDA_VISIBLE_DEVICES hides the other GPUs from the leader: refused before
    any device work, with the way out."""
    from jaxmg.describe import processes as _processes

    _processes.check_gpus_visible(4, "x", visible=None)  # unset: CUDA shows every GPU
    _processes.check_gpus_visible(2, "x", visible="3,1")
    with pytest.raises(ValueError, match=r"sees only CUDA_VISIBLE_DEVICES='1'.*local_device_ids"):
        _processes.check_gpus_visible(2, "x", visible="1")
    with pytest.raises(ValueError, match="every process must see every GPU"):
        _processes.check_gpus_visible(4, "x", visible="0,1,")


def test_host_mesh_and_gather_to_hosts_in_one_process(cpu_devices):
    """With one process the multi-node recipe is a plain reshard onto every device."""
    mesh = jaxmg.host_mesh(devices=cpu_devices)
    assert mesh.axis_names == ("host", "x") and mesh.devices.shape == (1, len(cpu_devices))
    n = 4 * len(cpu_devices)
    a = jnp.arange(n * n, dtype=jnp.float64).reshape(n, n)
    rows = jaxmg.gather_to_hosts(jax.device_put(a, NamedSharding(mesh, P(("host", "x")))), mesh)
    assert rows.sharding.spec == P("x", None)
    cols = jaxmg.gather_to_hosts(jax.device_put(a, NamedSharding(mesh, P())), mesh)
    assert cols.sharding.spec == P(None, "x")
    np.testing.assert_array_equal(np.asarray(rows), np.asarray(a))
    with pytest.raises(ValueError, match="2-D"):
        jaxmg.gather_to_hosts(a, jax.make_mesh((len(cpu_devices),), ("x",), devices=cpu_devices))


def test_no_shardmap_outside_shard_map(a, mesh):
    with pytest.raises(ValueError, match="no enclosing shard_map"):
        jaxmg.potri_no_shardmap(a)
    with jax.set_mesh(mesh), pytest.raises(ValueError, match="no enclosing shard_map"):
        jaxmg.potri_shardmap_ctx(a)


@pytest.mark.usefixtures("once_per_suite")
def test_no_shardmap_axis_that_cannot_be_told(mesh):
    """Inside a shard_map over two axes of one size, the block could be split over either."""
    if mesh.size < 4:
        pytest.skip("needs 4 devices")
    grid = jax.make_mesh((2, 2), ("a", "b"), devices=jax.devices()[:4])
    n = 8
    run = jax.shard_map(
        lambda a: jaxmg.potri_no_shardmap(a)[0],
        mesh=grid,
        in_specs=P(None, "a"),
        out_specs=P(None, "a"),
        check_vma=False,
    )
    arg = jax.device_put(jnp.eye(n), NamedSharding(grid, P(None, "a")))
    with pytest.raises(ValueError, match=r"cannot tell which axis .*\('a', 'b'\).*axis_name="):
        run(arg)
    with pytest.raises(ValueError, match="axis_name='c' is not an axis of the enclosing"):
        jax.shard_map(
            lambda a: jaxmg.potri_no_shardmap(a, axis_name="c")[0],
            mesh=grid,
            in_specs=P(None, "a"),
            out_specs=P(None, "a"),
            check_vma=False,
        )(arg)


@pytest.mark.usefixtures("once_per_suite")
def test_grid_blocks_in_shard_map_name_what_they_need():
    """``sharded_by="grid"``: the pair of axes is required; in one process with several
    devices the grid is refused with the launch that would work (it runs in tests/mpi)."""
    grid = jax.make_mesh((2, 2), ("a", "b"), devices=jax.devices()[:4])
    arg = jax.device_put(jnp.eye(8), NamedSharding(grid, P("a", "b")))

    def run(axis_name, backend="mp"):
        return jax.shard_map(
            lambda a: jaxmg.potrs_no_shardmap(
                a, jnp.ones(8), sharded_by="grid", axis_name=axis_name, backend=backend
            )[1],
            mesh=grid, in_specs=P("a", "b"), out_specs=P(), check_vma=False,
        )(arg)  # fmt: skip

    with pytest.raises(ValueError, match=r"sharded_by='grid' needs axis_name=\(r, c\).*got"):
        run("a")
    with pytest.raises(ValueError, match=r"names 'z', which is not an axis of the enclosing"):
        run(("a", "z"))
    with pytest.raises(ValueError, match=r"process grid P\('a', 'b'\).* only backend='mp'"):
        run(("a", "b"), backend="mg")
    with pytest.raises(ValueError, match=r"runs one process per device.*mesh axes 'a' x 'b'"):
        run(("a", "b"))
    with pytest.raises(ValueError, match=r"sharded_by must be 'cols', 'rows' or 'grid'"):
        jaxmg.potri_no_shardmap(jnp.eye(8), sharded_by="diagonal")


def test_factor_functions_name_what_they_accept(mesh, a):
    n = a.shape[0]
    with pytest.raises(TypeError, match=r"jaxmg.cho_solve: factor must be the CholeskyFactor"):
        jaxmg.cho_solve(a, jnp.ones(n))
    factor = jaxmg.cho_factor(a)
    with pytest.raises(ValueError, match=r"jaxmg.cho_solve: b must have shape"):
        jaxmg.cho_solve(factor, jnp.ones(n + 1))
    with pytest.raises(TypeError, match=r"b has dtype float32 but A has float64"):
        jaxmg.cho_solve(factor, jnp.ones(n, jnp.float32))
    with pytest.raises(ValueError, match=r"jaxmg.lu_solve: trans must be 0, 1, 2, 'N', 'T' or 'C'"):
        jaxmg.lu_solve(a, jnp.ones(n), trans=3)
    with pytest.raises(TypeError, match=r"jaxmg.lu_solve.*keyword"):
        jaxmg.lu_solve(a, jnp.ones(n), None, None, None, 1)
    rect = jax.device_put(jnp.ones((n, n // 2)), NamedSharding(mesh, P(None, "x")))
    with pytest.raises(ValueError, match=r"jaxmg.lu_factor: A must be square"):
        jaxmg.lu_factor(rect)


def test_gpu_mp_getrs_solves_with_a_and_refuses_its_transposes(monkeypatch):
    """Backend "mp" on GPUs: ``trans="N"`` reaches cuSOLVERMp's getrs once (the wrapper once
    called itself, a RecursionError on the first H100 run); ``"T"`` and ``"C"`` are refused."""
    import jaxmg_cuda.mp
    from jaxmg.engines import ENGINES

    calls = []
    monkeypatch.setattr(jaxmg_cuda.mp, "nccl_id", lambda: "id")
    monkeypatch.setattr(jaxmg_cuda.mp, "getrs", lambda *a, **kw: calls.append((a, kw)) or "x")
    getrs = ENGINES["mp"].routines("gpu", "jaxmg.lu_solve").getrs
    assert getrs("lu", "pivots", "b", trans="N") == "x"
    assert calls == [(("lu", "pivots", "b"), {"trans": "N", "nccl_id": "id"})]
    for trans in ("T", "C"):
        with pytest.raises(NotImplementedError, match="solve with A\\^T or A\\^H"):
            getrs("lu", "pivots", "b", trans=trans)
    assert len(calls) == 1
