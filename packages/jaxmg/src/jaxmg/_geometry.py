"""Where a call's matrix lives: mesh, solver axis, sharding form, devices.

Everything here runs at trace time, in Python, before any device work: it reads the sharding of
``A`` (or the ``mesh``/``in_specs`` the caller gave), checks that it is a form jaxmg accepts, and
returns a frozen description that the solvers use to build their ``shard_map``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import _processes

Form = Literal["cols", "rows"]

#: cuSolverMg's hard limit on the number of GPUs in one call.
MAX_GPUS = 16

#: Device id used in the rendezvous key when the concrete devices are not known at trace time
#: (inside a user's ``shard_map``): the native code then takes each participant's own device.
UNKNOWN_DEVICE = -1

_ACCEPTED = "A sharded over exactly one mesh axis, by columns P(None, ax) or by rows P(ax, None)"


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The resolved layout of one call.

    Attributes:
      mesh: the mesh of ``A`` (concrete, or abstract under ``jit`` with Explicit axes).
      axis: the mesh axis ``A`` is sharded over: the solver runs on the devices along it.
      form: ``"cols"`` for ``P(None, axis)``, ``"rows"`` for ``P(axis, None)``.
      ndev: the number of devices along ``axis``.
      platform: ``"cpu"`` or ``"gpu"``.
      device_ids: the participating devices in mesh-position order (CUDA ordinals on GPU, device
        ids on CPU), or ``UNKNOWN_DEVICE`` entries when only the abstract mesh is known.
      job: 0 when this process drives every device of the axis; else the multi-process mode
        (one device per process, one host) and the token the job's processes agreed on.
      pids: in the multi-process mode, the process id of each mesh position.
    """

    mesh: object
    axis: str
    form: Form
    ndev: int
    platform: str
    device_ids: tuple[int, ...]
    job: int = 0
    pids: tuple[int, ...] = ()

    @property
    def native_job(self) -> dict:
        """The multi-process attributes of the native call."""
        return {"job": self.job, "pids": self.pids or None}

    @property
    def spec(self) -> P:
        return P(None, self.axis) if self.form == "cols" else P(self.axis, None)

    @property
    def sharded_dim(self) -> int:
        """The dimension of the local block that is split over devices."""
        return 1 if self.form == "cols" else 0


def _normalise(spec) -> tuple:
    entries = tuple(spec) + (None,) * (2 - len(tuple(spec)))
    if len(entries) != 2:
        raise ValueError(f"in_specs[0]={spec!r} has {len(entries)} entries; A is 2-D. {_ACCEPTED}.")
    return entries


def _axis_and_form(spec, where: str) -> tuple[str, Form]:
    rows, cols = _normalise(spec)
    if rows is None and isinstance(cols, str):
        return cols, "cols"
    if cols is None and isinstance(rows, str):
        return rows, "rows"
    raise ValueError(f"{where} is {spec!r}; jaxmg accepts {_ACCEPTED}.")


def _concrete_sharding(a):
    """The NamedSharding of a concrete array, or the abstract one of a tracer (Explicit axes)."""
    sharding = getattr(a, "sharding", None)
    if isinstance(sharding, NamedSharding):
        return sharding
    try:
        aval_sharding = jax.typeof(a).sharding
    except Exception:  # not a JAX value: validated elsewhere
        return None
    if isinstance(aval_sharding, NamedSharding) and not aval_sharding.mesh.empty:
        if any(entry is not None for entry in aval_sharding.spec):
            return aval_sharding
    return None


def _platform(mesh) -> str:
    if isinstance(mesh, jax.sharding.Mesh):
        platform = mesh.devices.flat[0].platform
    else:
        platform = mesh.abstract_device.platform
    return "gpu" if platform in ("cuda", "gpu") else platform


def _check_single_slice(mesh, axis: str) -> None:
    others = {name: size for name, size in mesh.shape.items() if name != axis}
    if any(size > 1 for size in others.values()):
        raise ValueError(
            f"cannot tell which devices along mesh axis {axis!r} run together from the "
            f"abstract mesh {dict(mesh.shape)}: call with a concrete mesh= whose other axes "
            "place one slice in this process."
        )


def local_slice(owners: np.ndarray, me: int, axis: str, shape: dict) -> int:
    """Index of the one slice of ``axis`` this process takes part in; an error for any other setup.

    ``owners[r, j]``: the process of device ``j`` in slice ``r``. Each process solves on one
    slice (the others, on other processes, solve on theirs).
    """
    mine = [r for r in range(owners.shape[0]) if (owners[r] == me).any()]
    if len(mine) != 1:
        raise ValueError(
            f"this process holds devices in {len(mine)} slices of mesh axis {axis!r} "
            f"(mesh {shape}); jaxmg solves on exactly one slice per process: shard A "
            "over an axis whose other mesh axes place one slice in this process."
        )
    return mine[0]


def _participants(mesh, axis: str, platform: str):
    """``(device_ids, job, pids)`` of this process's slice of ``axis``, in mesh order."""
    ndev = dict(mesh.shape)[axis]
    if not isinstance(mesh, jax.sharding.Mesh):
        _check_single_slice(mesh, axis)
        return (UNKNOWN_DEVICE,) * ndev, 0, ()
    grid = np.moveaxis(mesh.devices, mesh.axis_names.index(axis), -1).reshape(-1, ndev)
    owners = np.vectorize(lambda d: d.process_index, otypes=[np.int64])(grid)
    r = local_slice(owners, jax.process_index(), axis, dict(mesh.shape))
    row = grid[r]
    if platform == "gpu":
        ids = tuple(int(d.local_hardware_id) for d in row)
    else:
        ids = tuple(int(d.id) for d in row)
    if _processes.classify(owners[r], axis) == "single":
        return ids, 0, ()
    job = _processes.job()
    _processes.check_one_host(owners[r], job.hosts, axis)
    if platform == "gpu":
        _processes.check_gpu_multiprocess_enabled(axis)
        _processes.check_gpus_visible(ndev, axis)
        # Remote devices have no local hardware id here; the native leader finds each GPU by
        # its PCI bus id, and the ids only name the call.
        ids = tuple(int(d.id) for d in row)
    return ids, job.token, tuple(job.pids[int(p)] for p in owners[r])


def check_device_count(ndev: int, platform: str, axis: str) -> None:
    if platform == "gpu" and ndev > MAX_GPUS:
        raise ValueError(
            f"A is sharded over {ndev} GPUs along {axis!r}; cuSolverMg accepts at most "
            f"{MAX_GPUS}. Use a mesh axis of at most {MAX_GPUS} devices."
        )


def resolve(a, mesh=None, in_spec=None, *, argname: str = "A") -> Geometry:
    """Work out mesh, axis and form of ``a`` from its sharding or from ``mesh``/``in_spec``.

    Raises ValueError naming what was found and what is accepted when the sharding is not one
    jaxmg can solve on, or when ``mesh``/``in_spec`` contradict the sharding ``a`` carries.
    """
    found = _concrete_sharding(a)
    if (mesh is None) != (in_spec is None) and found is None:
        raise ValueError(
            f"{argname} carries no sharding, so pass both mesh= and in_specs= "
            f"(got mesh={mesh!r}, in_specs entry {in_spec!r})."
        )
    if in_spec is not None:
        axis, form = _axis_and_form(in_spec, "in_specs[0]")
        if found is not None:
            found_spec = _normalise(found.spec)
            if found_spec != _normalise(in_spec):
                raise ValueError(
                    f"{argname} is sharded as {found.spec!r} but in_specs[0] is {in_spec!r}; "
                    "they must agree (or omit in_specs to use the array's own sharding)."
                )
        mesh = mesh if mesh is not None else found.mesh
    elif found is not None:
        axis, form = _axis_and_form(found.spec, f"the sharding of {argname}")
        if mesh is not None and found.mesh.shape != mesh.shape:
            raise ValueError(f"{argname} lives on mesh {found.mesh} but mesh={mesh} was given.")
        mesh = mesh if mesh is not None else found.mesh
    else:
        raise ValueError(
            f"cannot find the sharding of {argname}: it is not a sharded jax.Array (inside jit "
            "on a mesh with Auto axes the sharding is not visible). Pass mesh= and in_specs=, "
            f"with {_ACCEPTED}."
        )
    if axis not in mesh.axis_names:
        raise ValueError(f"mesh axis {axis!r} is not in the mesh axes {mesh.axis_names}.")
    platform = _platform(mesh)
    if platform not in ("cpu", "gpu"):
        raise ValueError(
            f"jaxmg runs on NVIDIA GPUs (cuSolverMg) and on CPU devices (LAPACK twin), "
            f"not on {platform!r} devices."
        )
    device_ids, job, pids = _participants(mesh, axis, platform)
    check_device_count(len(device_ids), platform, axis)
    return Geometry(mesh, axis, form, len(device_ids), platform, device_ids, job, pids)


def from_abstract_mesh(axis_name: str, form: Form) -> Geometry:
    """The geometry inside a user's ``shard_map``, where only the abstract mesh is known."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or axis_name not in mesh.axis_names:
        raise ValueError(
            f"axis_name={axis_name!r} is not an axis of the enclosing shard_map (axes: "
            f"{getattr(mesh, 'axis_names', ())}); the *_no_shardmap functions must be called "
            "inside jax.shard_map on local shards."
        )
    _check_single_slice(mesh, axis_name)
    ndev = dict(mesh.shape)[axis_name]
    platform = _platform(mesh)
    local = jax.local_device_count(platform)
    if ndev > local:
        raise ValueError(
            f"axis {axis_name!r} has {ndev} devices but this process drives {local} {platform} "
            "devices: inside a user's shard_map jaxmg cannot tell which processes hold them. "
            "In a multi-process job call jaxmg.potrs/potri/syevd with the concrete mesh instead "
            "of the *_no_shardmap functions."
        )
    check_device_count(ndev, platform, axis_name)
    return Geometry(mesh, axis_name, form, ndev, platform, (UNKNOWN_DEVICE,) * ndev)
