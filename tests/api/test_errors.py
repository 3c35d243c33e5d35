"""Bad input raises before any device work, naming the argument, what it got, what is accepted."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

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
    with pytest.raises(ValueError, match=f"T_A must be a positive int, got {T_A}"):
        jaxmg.potri(a, T_A)


@pytest.mark.parametrize("relayout", ["xla", None, "NATIVE"])
def test_unknown_relayout(a, relayout):
    with pytest.raises(ValueError, match=f"relayout must be 'native'.* or 'jax'.*got {relayout!r}"):
        jaxmg.potrs(a, jnp.ones(a.shape[0]), 4, relayout=relayout)


@pytest.mark.parametrize("T_A", [2.0, True, "4"])
def test_non_integer_tile(a, T_A):
    with pytest.raises(TypeError, match="T_A must be a positive int"):
        jaxmg.potri(a, T_A)


def test_shard_narrower_than_device_count(mesh):
    if mesh.size < 2:
        pytest.skip("needs 2 devices")
    n = mesh.size  # one column per device: fewer than the device count only for 1 < ndev
    a = jax.device_put(jnp.eye(n), NamedSharding(mesh, P(None, "x")))
    with pytest.raises(ValueError, match=r"jaxmg.potri: each device holds 1 column"):
        jaxmg.potri(a, 1)


def test_two_axis_sharding(mesh):
    if mesh.size < 4 or mesh.size % 2:
        pytest.skip("needs an even number of at least 4 devices")
    mesh2 = jax.make_mesh((2, mesh.size // 2), ("a", "b"))
    a = jax.device_put(jnp.eye(4 * mesh.size), NamedSharding(mesh2, P("a", "b")))
    with pytest.raises(ValueError, match=r"jaxmg accepts A sharded over exactly one mesh axis"):
        jaxmg.potri(a, 2)


def test_replicated_matrix(mesh):
    a = jax.device_put(jnp.eye(4 * mesh.size), NamedSharding(mesh, P()))
    with pytest.raises(ValueError, match="cannot find the sharding of A|exactly one mesh axis"):
        jaxmg.potri(a, 2)


def test_in_specs_inconsistent_with_sharding(a, mesh):
    with pytest.raises(ValueError, match=r"A is sharded as .* but in_specs\[0\] is"):
        jaxmg.potri(a, 2, mesh=mesh, in_specs=(P("x", None),))


def test_in_specs_wrong_length(a, mesh):
    with pytest.raises(ValueError, match="in_specs must hold 2 PartitionSpec"):
        jaxmg.potrs(a, jnp.ones(a.shape[0]), 2, mesh=mesh, in_specs=(P(None, "x"), P(), P()))


def test_plain_array_without_mesh():
    with pytest.raises(ValueError, match="(?i)pass mesh= and in_specs="):
        jax.jit(lambda x: jaxmg.potri(x, 2))(np.eye(8))


def test_n_not_divisible(mesh):
    if mesh.size < 2:
        pytest.skip("every N divides over one device")
    with pytest.raises(ValueError):
        jax.device_put(jnp.eye(4 * mesh.size + 1), NamedSharding(mesh, P(None, "x")))


def test_more_than_16_gpus_is_refused():
    from jaxmg import _geometry

    with pytest.raises(ValueError, match="17 GPUs .* cuSolverMg accepts at most 16"):
        _geometry.check_device_count(17, "gpu", "x")
    _geometry.check_device_count(16, "gpu", "x")
    _geometry.check_device_count(17, "cpu", "x")  # the CPU twin has no such limit


def test_cyclic_wrong_shape(a, mesh):
    shard = a.shape[1] // mesh.size
    valid = jaxmg.calculate_all_valid_T_A(shard, mesh.size, shard)
    widening = [t for t in valid if shard % t]
    if not widening:
        pytest.skip(f"no valid tile size pads a shard of {shard} on {mesh.size} devices")
    with pytest.raises(ValueError, match="with cyclic_1d=True, A must already be"):
        jaxmg.potrs(a, jnp.ones(a.shape[0]), widening[0], cyclic_1d=True)


def test_which_processes_drive_the_axis():
    """One process for the whole axis, or one device per process on one host; anything else
    is refused at call time with what was found, never attempted."""
    from jaxmg import _geometry, _processes

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
        _geometry.local_slice(np.zeros((2, 2), np.int64), 0, "x", {"r": 2, "x": 2})
    assert _geometry.local_slice(np.array([[0, 0], [1, 1]]), 1, "x", {"r": 2, "x": 2}) == 1
    assert _geometry.local_slice(np.array([[0, 1]]), 1, "x", {"x": 2}) == 0


@pytest.mark.parametrize("value", [None, "0", "yes"])
def test_gpu_multiprocess_is_opt_in_until_run_on_hardware(monkeypatch, value):
    """One GPU per process (CUDA IPC) has not yet run on GPU hardware: refused unless
    JAXMG_GPU_MULTIPROCESS=1, with how to opt in and the alternative."""
    from jaxmg import _processes

    if value is None:
        monkeypatch.delenv(_processes.GPU_MULTIPROCESS_ENV, raising=False)
    else:
        monkeypatch.setenv(_processes.GPU_MULTIPROCESS_ENV, value)
    with pytest.raises(NotImplementedError, match="JAXMG_GPU_MULTIPROCESS=1.*drives all of its"):
        _processes.check_gpu_multiprocess_enabled("x")
    monkeypatch.setenv(_processes.GPU_MULTIPROCESS_ENV, "1")
    _processes.check_gpu_multiprocess_enabled("x")


def test_gpu_multiprocess_needs_every_gpu_visible():
    """A per-process CUDA_VISIBLE_DEVICES hides the other GPUs from the leader: refused before
    any device work, with the way out."""
    from jaxmg import _processes

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
