"""Where a call's matrix lives: mesh, solver axis, sharding form, devices.

Everything here runs at trace time, in Python, before any device work: it reads the sharding of
``A`` (or the ``mesh``/``in_specs`` the caller gave), checks that it is a form jaxmg accepts, and
returns a frozen description that the solvers use to build their ``shard_map``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax
import jax.extend.core
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from . import _processes

Form = Literal["cols", "rows", "grid"]

#: cuSolverMg's hard limit on the number of GPUs in one call.
MAX_GPUS = 16

#: Device id used when the concrete devices are not known at trace time (_processes).
UNKNOWN_DEVICE = _processes.UNKNOWN_DEVICE

_ACCEPTED = (
    "A sharded over exactly one mesh axis, by columns P(None, ax) or by rows P(ax, None), or "
    "(backend='mp') over a process grid P(r, c)"
)


@dataclasses.dataclass(frozen=True)
class Geometry:
    """The resolved layout of one call.

    Attributes:
      mesh: the mesh of ``A`` (concrete, or abstract under ``jit`` with Explicit axes).
      axis: the mesh axis ``A`` is sharded over: the solver runs on the devices along it. For
        ``"grid"``, the axis of the process columns.
      form: ``"cols"`` for ``P(None, axis)``, ``"rows"`` for ``P(axis, None)``, ``"grid"`` for
        ``P(row_axis, axis)`` (backend ``"mp"`` only: ScaLAPACK's 2D process grid).
      ndev: the number of devices along ``axis`` (``"grid"``: on the whole grid).
      platform: ``"cpu"`` or ``"gpu"``.
      device_ids: the participating devices in mesh-position order (CUDA ordinals on GPU, device
        ids on CPU), or ``UNKNOWN_DEVICE`` entries when only the abstract mesh is known.
      job: 0 when this process drives every device of the axis; else the multi-process mode
        (one device per process, one host) and the token the job's processes agreed on.
      pids: in the multi-process mode, the process id of each mesh position.
      backend: ``"mg"`` (cuSolverMg / the LAPACK twin, one node), ``"mp"`` (the distributed
        engine, one process per device: ScaLAPACK over MPI on CPUs) or ``"jax"`` (JAX's own
        dense solvers on a solver axis of one device, :mod:`jaxmg._dense`; chosen by
        :func:`choose_backend`, never asked for).
      row_axis: for ``"grid"``, the mesh axis of the process rows.
    """

    mesh: object
    axis: str
    form: Form
    ndev: int
    platform: str
    device_ids: tuple[int, ...]
    job: int = 0
    pids: tuple[int, ...] = ()
    backend: str = "mg"
    row_axis: str | None = None

    @property
    def grid(self) -> tuple[int, int]:
        """The process grid ``(rows, cols)``: ``P(r, c)``'s, else ``1 x ndev`` (the 1D
        block-cyclic columns)."""
        if self.form == "grid":
            rows = dict(self.mesh.shape)[self.row_axis]
            return rows, self.ndev // rows
        return 1, self.ndev

    @property
    def axes(self) -> tuple[str, ...]:
        """Every mesh axis the matrix is split over (for collectives over all its devices)."""
        return (self.row_axis, self.axis) if self.form == "grid" else (self.axis,)

    def position(self):
        """This device's flat position on the solver's grid, inside ``shard_map`` (row-major
        over ``P(r, c)``)."""
        if self.form == "grid":
            rows, cols = self.grid
            return jax.lax.axis_index(self.row_axis) * cols + jax.lax.axis_index(self.axis)
        return jax.lax.axis_index(self.axis)

    @property
    def native_job(self) -> dict:
        """The engine's own attributes of the native call: the multi-process ones for ``"mg"``,
        the process grid for ``"mp"``."""
        if self.backend == "mp":
            return {"grid": self.grid}
        return {"job": self.job, "pids": self.pids or None}

    @property
    def spec(self) -> P:
        if self.form == "grid":
            return P(self.row_axis, self.axis)
        return P(None, self.axis) if self.form == "cols" else P(self.axis, None)

    @property
    def factor_spec(self) -> P:
        """The sharding of a factor as the engine leaves it: every device's local array (the
        column-major storage of its tiles), stacked along the solver's axes."""
        return self.spec if self.form == "grid" else P(self.axis, None)

    @property
    def pivots_spec(self) -> P:
        """The sharding of LU's pivots: every device's local pivot vector, stacked."""
        return P(self.axes)

    @property
    def blocks_grid(self) -> tuple[int, int]:
        """The process grid of ``A``'s blocks as JAX holds them: ``P(r, c)``'s, ``P x 1`` by
        rows, ``1 x P`` by columns (ScaLAPACK's rectangular routines and jaxmg 1.x's status
        see this grid; :attr:`grid` is the block-cyclic one of the square solvers)."""
        if self.form == "grid":
            return self.grid
        return (self.ndev, 1) if self.form == "rows" else (1, self.ndev)

    @property
    def sharded_dim(self) -> int:
        """The dimension of the local block that is split over devices."""
        return 1 if self.form == "cols" else 0


def _normalise(spec) -> tuple:
    entries = tuple(spec) + (None,) * (2 - len(tuple(spec)))
    if len(entries) != 2:
        raise ValueError(f"in_specs[0]={spec!r} has {len(entries)} entries; A is 2-D. {_ACCEPTED}.")
    return entries


def _axis_and_form(spec, where: str) -> tuple[str, Form, str | None]:
    """``(axis, form, row_axis)`` of a spec (``row_axis``: ``P(r, c)``'s ``r``, else None)."""
    rows, cols = _normalise(spec)
    if rows is None and isinstance(cols, str):
        return cols, "cols", None
    if cols is None and isinstance(rows, str):
        return rows, "rows", None
    if isinstance(rows, str) and isinstance(cols, str) and rows != cols:
        return cols, "grid", rows
    raise ValueError(f"{where} is {spec!r}; jaxmg accepts {_ACCEPTED}.")


def _inferred_spec(mesh, carried, argname: str) -> P:
    """jaxmg 1.x's sharding of a matrix whose own says nothing (replicated, or under ``jit`` on
    Auto axes, where it is not part of the type): rows ``P(ax, None)`` over a one-axis mesh,
    ``P(r, c)`` over a two-axis one (then :func:`_squeezed`)."""
    names = tuple(mesh.axis_names)
    if len(names) == 1:
        return P(names[0], None)
    if len(names) == 2:
        return P(*names)
    if carried is None:
        found = "it is not a sharded jax.Array"
    elif isinstance(carried.mesh, jax.sharding.AbstractMesh) and any(
        t == jax.sharding.AxisType.Auto for t in carried.mesh.axis_types
    ):
        found = (
            "inside jit its sharding over the mesh's Auto axes is not visible (only "
            "Explicit axes are part of an array's type)"
        )
    else:
        found = "it is replicated"
    raise ValueError(
        f"cannot find how to shard {argname}: {found}, and its mesh has {len(names)} axes "
        f"{names} (one axis means rows, two a process grid). Pass in_specs= (and mesh=, unless "
        f"jax.set_mesh is in effect), with {_ACCEPTED}."
    )


def _squeezed(spec, mesh) -> P:
    """``P(r, c)`` over a grid with one process row (column), in a job of one process, is
    ``P(None, c)`` (``P(r, None)``): the 1D form, which every engine takes (NetKet's
    ``process_grid=(n, 1)`` mesh). A grid needs ``backend="mp"``, one process per device, so in
    one process the grid form could not run at all; in a job of several processes it stays a
    grid, as jaxmg 1.x runs it."""
    rows, cols = _normalise(spec)
    if not (isinstance(rows, str) and isinstance(cols, str) and rows != cols):
        return spec
    if jax.process_count() > 1:
        return spec
    sizes = dict(mesh.shape)
    if sizes.get(cols) == 1:
        return P(rows, None)
    if sizes.get(rows) == 1:
        return P(None, cols)
    return spec


def is_tracer(x) -> bool:
    """Whether ``x`` is a value being traced (under ``jit``, ``vmap``, ...), not a concrete one."""
    return isinstance(x, jax.core.Tracer)


def concrete_value(x):
    """The concrete array behind ``x``: ``x`` itself, or, for a value being differentiated
    eagerly (``jax.grad``, ``jvp``, ``vjp`` outside ``jit``), the array it stands for; ``None``
    under ``jit``, where there is none."""
    if not is_tracer(x):
        return x
    try:
        return jax.extend.core.concrete_or_error(None, x)
    except jax.errors.ConcretizationTypeError:
        return None


def _carried_sharding(a):
    """The NamedSharding ``a`` carries: a concrete array's (also behind an eager derivative's
    tracer: its concrete mesh, and its spec on Auto axes too), or the one in a tracer's type.

    Under ``jit`` a tracer's type names the abstract mesh of its argument (with the spec on
    Explicit axes; on Auto axes the spec is all None). ``None`` when ``a`` carries no mesh.
    """
    sharding = getattr(concrete_value(a), "sharding", None)
    if isinstance(sharding, NamedSharding):
        return sharding
    try:
        aval_sharding = jax.typeof(a).sharding
    except Exception:  # not a JAX value: validated elsewhere
        return None
    if isinstance(aval_sharding, NamedSharding) and not aval_sharding.mesh.empty:
        return aval_sharding
    return None


def _outside_jit_mesh():
    """The concrete mesh of ``jax.set_mesh`` when not tracing (``get_mesh`` refuses under jit)."""
    try:
        mesh = jax.sharding.get_mesh()
    except ValueError:
        return None
    return None if mesh is None or mesh.empty else mesh


def _solver_mesh(mesh, carried, in_spec, argname: str):
    """The mesh the call runs on: the concrete one where it can be found, else abstract.

    ``mesh`` may be a ``Mesh``, an ``AbstractMesh`` (``jax.sharding.get_abstract_mesh()``, as
    NetKet passes it) or ``None``: then the mesh ``A`` carries, else the one of ``jax.set_mesh``.
    An abstract mesh is made concrete from ``A``'s own mesh or, outside ``jit``, from
    ``jax.set_mesh``; under ``jit`` it stays abstract, which is usable where it is the context
    mesh or the mesh of ``A``'s type (XLA then knows the devices).
    """
    if mesh is None:
        axis_wanted = None if in_spec is None else _axis_and_form(in_spec, "in_specs[0]")[0]
        if carried is not None and (axis_wanted is None or axis_wanted in carried.mesh.axis_names):
            mesh = carried.mesh
        else:
            mesh = jax.sharding.get_abstract_mesh()
            if mesh.empty:
                raise ValueError(
                    f"{argname} carries no mesh and no jax.set_mesh is in effect: pass mesh= (a "
                    "jax.sharding.Mesh, or jax.sharding.get_abstract_mesh() under jax.set_mesh)"
                    f" and in_specs=, with {_ACCEPTED}."
                )
    if isinstance(mesh, jax.sharding.Mesh):
        return mesh
    if not isinstance(mesh, jax.sharding.AbstractMesh):
        raise TypeError(
            f"mesh must be a jax.sharding.Mesh or AbstractMesh, got {type(mesh).__name__}."
        )
    if mesh.empty:
        raise ValueError(
            "mesh= is an empty AbstractMesh (jax.sharding.get_abstract_mesh() with no "
            "jax.set_mesh in effect): pass the jax.sharding.Mesh, or call under "
            "jax.set_mesh(mesh)."
        )
    for known in (getattr(carried, "mesh", None), _outside_jit_mesh()):
        if isinstance(known, jax.sharding.Mesh) and known.abstract_mesh == mesh:
            return known
    if len(mesh.axis_names) > 1 and mesh.size == jax.device_count():
        return _in_device_order(mesh)
    if mesh != jax.sharding.get_abstract_mesh() and getattr(carried, "mesh", None) != mesh:
        raise ValueError(
            f"mesh={mesh} is abstract and no concrete mesh with its devices is known here: "
            f"{argname} does not live on it and it is not the mesh of jax.set_mesh. Pass the "
            "jax.sharding.Mesh, or call under jax.set_mesh(mesh)."
        )
    return mesh


def _in_device_order(mesh: jax.sharding.AbstractMesh) -> jax.sharding.Mesh:
    """The concrete mesh of an abstract one of several axes over every device, laid out in
    ``jax.devices()`` order (as ``jax.make_mesh`` lays out CPUs, and NetKet's ``process_grid``
    meshes are). Under ``jit`` (jax 0.10), ``shard_map`` over an abstract mesh that is not the
    one ``jax.set_mesh`` made concrete fails ("unbound axis name"): NetKet's grid mesh, entered
    with ``use_abstract_mesh`` inside its ``set_mesh``. Arrays on the same devices in another
    order are moved by XLA, or refused by it; never misread."""
    devices = np.asarray(jax.devices(), dtype=object).reshape(tuple(mesh.axis_sizes))
    return jax.sharding.Mesh(devices, mesh.axis_names, axis_types=mesh.axis_types)


def _platform(mesh) -> str:
    if isinstance(mesh, jax.sharding.Mesh):
        platform = mesh.devices.flat[0].platform
    else:
        platform = mesh.abstract_device.platform
    return "gpu" if platform in ("cuda", "gpu") else platform


def check_spec_axes(spec, mesh, where: str) -> None:
    """Raises ValueError when ``spec`` names an axis ``mesh`` does not have."""
    for entry in spec:
        for name in entry if isinstance(entry, tuple) else (entry,):
            if name is not None and name not in mesh.axis_names:
                raise ValueError(
                    f"{where} is {spec!r}, but the mesh has no axis {name!r} (axes: "
                    f"{mesh.axis_names})."
                )


def check_device_count(ndev: int, platform: str, axis: str) -> None:
    if platform == "gpu" and ndev > MAX_GPUS:
        raise ValueError(
            f"A is sharded over {ndev} GPUs along {axis!r}; cuSolverMg accepts at most "
            f"{MAX_GPUS}. Use a mesh axis of at most {MAX_GPUS} devices."
        )


def resolve(
    a,
    mesh=None,
    in_spec=None,
    *,
    argname: str = "A",
    backend=None,
    caller: str = "jaxmg",
    cyclic: bool = False,
) -> Geometry:
    """Work out mesh, axis and form of ``a`` from ``mesh``/``in_spec`` or from its sharding.

    ``in_spec``, when given, decides where ``a`` goes (the caller then places it so, whatever
    its sharding now); else ``a``'s own sharding does. ``mesh`` as in :func:`_solver_mesh`.
    ``cyclic``: ``a`` is in the block-cyclic layout (``cyclic_1d=True``), which only the
    native engines take.

    Raises ValueError naming what was found and what is accepted when the sharding is not one
    jaxmg can solve on.
    """
    carried = _carried_sharding(a)
    mesh = _solver_mesh(mesh, carried, in_spec, argname)
    if in_spec is not None:
        spec, where = in_spec, "in_specs[0]"
    elif carried is not None and any(entry is not None for entry in carried.spec):
        spec, where = carried.spec, f"the sharding of {argname}"
    else:
        spec, where = _inferred_spec(mesh, carried, argname), "the inferred sharding"
    axis, form, row_axis = _axis_and_form(_squeezed(spec, mesh), where)
    for name in (axis, row_axis) if form == "grid" else (axis,):
        if name not in mesh.axis_names:
            raise ValueError(f"mesh axis {name!r} is not in the mesh axes {mesh.axis_names}.")
    platform = _platform(mesh)
    if platform not in ("cpu", "gpu"):
        raise ValueError(
            f"jaxmg runs on NVIDIA GPUs (cuSolverMg) and on CPU devices (LAPACK twin), "
            f"not on {platform!r} devices."
        )
    if form == "grid":
        _refuse_grid_on_mg(backend, row_axis, axis, argname, caller)
        ndev = _mp_processes(mesh, (row_axis, axis), platform, caller)
        unknown = (UNKNOWN_DEVICE,) * ndev
        return Geometry(mesh, axis, form, ndev, platform, unknown, backend="mp", row_axis=row_axis)
    backend = choose_backend(backend, mesh, axis, platform, cyclic=cyclic)
    if backend == "jax":
        return _dense_geometry(mesh, axis, form, platform)
    if backend == "mp":
        ndev = _mp_processes(mesh, (axis,), platform, caller)
        return Geometry(mesh, axis, form, ndev, platform, (UNKNOWN_DEVICE,) * ndev, backend="mp")
    device_ids, job, pids = _processes.participants(mesh, axis, platform)
    check_device_count(len(device_ids), platform, axis)
    return Geometry(mesh, axis, form, len(device_ids), platform, device_ids, job, pids)


def choose_backend(backend, mesh, axis: str, platform: str, *, cyclic: bool = False) -> str:
    """``backend`` as given, or for ``None`` the automatic choice: ``"jax"`` (JAX's own dense
    solvers, :mod:`jaxmg._dense`) when ``axis`` holds one device and ``A`` is not given
    block-cyclic (``cyclic``): there is nothing to distribute, and one device's dense solvers
    are faster than cuSolverMg (and, on CPUs, as fast as the LAPACK twin except for potri and
    eigenvalues alone, which JAX's lack: ``backend="mg"`` there); ``"mp"`` when the
    devices of ``axis`` are more GPUs than cuSolverMg takes or live on several hosts; else
    ``"mg"``. A process of a multi-process job whose solver axis holds its one device (as
    :func:`jaxmg.host_mesh` gives with one device per process) solves alone, on ``"jax"``."""
    if backend is not None:
        return backend
    ndev = dict(mesh.shape)[axis]
    if ndev == 1 and not cyclic:
        return "jax"
    if platform == "gpu" and ndev > MAX_GPUS:
        return "mp"
    if jax.process_count() == 1:
        return "mg"
    hosts = _processes.job().hosts
    if isinstance(mesh, jax.sharding.Mesh):
        processes = {d.process_index for d in mesh.devices.flat}
    else:
        processes = range(jax.process_count())
    return "mp" if len({hosts[p] for p in processes}) > 1 else "mg"


def _dense_geometry(mesh, axis: str, form: Form, platform: str) -> Geometry:
    """The geometry of backend ``"jax"``: one device, which solves alone (each device of the
    mesh's other axes, in any process, solves its own copy); no rendezvous, so its device
    and process need not be known."""
    return Geometry(mesh, axis, form, 1, platform, (UNKNOWN_DEVICE,), backend="jax")


def _mp_processes(mesh, axes: tuple[str, ...], platform: str, caller: str) -> int:
    """The number of processes of a ``"mp"`` call after checking its setup: the mesh ``axes``
    (one, or ``P(r, c)``'s two) hold one device of every process of the job, in process order
    (row-major over a grid), and the mesh nothing else."""
    shape = dict(mesh.shape)
    ndev, processes = math.prod(shape[a] for a in axes), jax.process_count()
    others = {name: size for name, size in shape.items() if name not in axes and size > 1}
    listed = " x ".join(map(repr, axes))
    named = ("mesh axis " if len(axes) == 1 else "mesh axes ") + listed
    if isinstance(mesh, jax.sharding.Mesh):
        order = [mesh.axis_names.index(a) for a in axes]
        order += [i for i in range(len(mesh.axis_names)) if i not in order]
        owners = [d.process_index for d in np.transpose(mesh.devices, order).flat]
        if sorted(owners) == list(range(processes)) and owners != sorted(owners):
            raise ValueError(
                f"{caller}: backend='mp' needs the devices of {named} in process order (position p "
                f"on process p, row-major; found processes {owners}): ScaLAPACK's grid follows "
                "the MPI ranks. Build the mesh with jax.make_mesh, or sort its devices by "
                "process_index."
            )
        fits = owners == list(range(processes))
    else:
        fits = jax.local_device_count(platform) == 1
    if others or ndev != processes or not fits:
        raise ValueError(
            f"{caller}: backend='mp' runs one process per device over every process of the job: "
            f"{named} must hold exactly one device of each of the {processes} processes, and "
            f"no other axis may split it; found the mesh {shape}"
            + ("" if others else f" with {ndev} device(s) on {listed}")
            + ". Launch one process per device (mpiexec -n P python prog.py, each initialising "
            "jax.distributed with one local device)."
        )
    return ndev


def _refuse_grid_on_mg(backend, row_axis: str, axis: str, what: str, caller: str) -> None:
    if backend == "mg":
        raise ValueError(
            f"{caller}: {what} is sharded over a process grid P({row_axis!r}, {axis!r}), which "
            "only backend='mp' (ScaLAPACK's 2D block-cyclic layout) solves on; backend='mg' "
            "(cuSolverMg, 1D) takes P(None, ax) or P(ax, None)."
        )
