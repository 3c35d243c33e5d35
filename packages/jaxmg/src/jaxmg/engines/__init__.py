"""The engines, one module each behind :class:`jaxmg.engines.base.Engine`, and the one place
that chooses among them.

- :mod:`jaxmg.engines.mg`: backend ``"mg"``, cuSolverMg on GPUs and its LAPACK twin on CPUs;
- :mod:`jaxmg.engines.mp`: backend ``"mp"``, the distributed engine (ScaLAPACK over MPI,
  cuSOLVERMp over NCCL);
- :mod:`jaxmg.engines.dense` and :mod:`jaxmg.engines.collectives`: backend ``"jax"``, JAX's own
  dense solvers on one device, and on several a blocked Cholesky, LU and a tridiagonal
  eigensolver in XLA's collectives (:mod:`jaxmg.engines.tridiagonal`, with block Jacobi,
  :mod:`jaxmg.engines.jacobi`, where it cannot).

A new engine is a new module with its ``ENGINE`` and one line in :data:`ENGINES`. This module is
the only one that reads a backend's name: it checks ``backend=`` (:func:`asked`), chooses the
engine of a call (:func:`choose`), and has it describe where the call runs (:func:`geometry`).
"""

from __future__ import annotations

import jax

from ..describe import checks, processes, sharding
from ..describe.call import Geometry
from . import collectives, dense as dense, mg, mp
from .base import Engine

#: Every engine, by the ``backend=`` value that names it.
ENGINES: dict[str, Engine] = {
    engine.name: engine for engine in (mg.ENGINE, mp.ENGINE, collectives.ENGINE)
}

#: The names a caller may pass as ``backend=``.
PUBLIC = tuple(name for name, engine in ENGINES.items() if engine.public)


def asked(value, caller: str) -> Engine | None:
    """The engine ``backend=value`` asks for (``None``: automatic), or a ValueError naming the
    accepted ones."""
    if value is None or value == "auto":
        return None
    if not isinstance(value, str) or value not in PUBLIC:
        raise ValueError(
            f"{caller}: backend must be 'mg' (cuSolverMg / its LAPACK twin, one node), 'mp' (the "
            "distributed engine, one process per device), 'jax' (JAX's own solvers and "
            f"collectives, any platform) or None (automatic), got {value!r}."
        )
    return ENGINES[value]


def choose(
    engine: Engine | None, mesh, axis: str, platform: str, *, cyclic: bool = False, caller="jaxmg"
):
    """``engine`` as asked, or for ``None`` the automatic choice: JAX's own dense solvers when
    ``axis`` holds one device and ``A`` is not given block-cyclic (``cyclic``): there is nothing
    to distribute, and one device's dense solvers are faster than cuSolverMg (and, on CPUs, as
    fast as the LAPACK twin except for potri and eigenvalues alone, which JAX's lack:
    ``backend="mg"`` there); the distributed engine when the devices of ``axis`` are more than
    cuSolverMg takes or live on several hosts; else cuSolverMg. A native engine is chosen only
    where it says it can run the call (:meth:`Engine.can_run`: jaxmg-cuda installed, a platform
    it runs on, processes and a mesh it solves on, which under ``jit`` it must be able to tell
    from the abstract mesh); elsewhere backend ``"jax"``, which runs any call. A process of a
    multi-process job whose solver axis holds its one device (as :func:`jaxmg.host_mesh` gives
    with one device per process) solves alone, on JAX's."""
    ndev = dict(mesh.shape)[axis]
    engine = engine or _automatic(ndev, mesh, axis, platform, cyclic, caller)
    return engine.alone if ndev == 1 and engine.alone is not None else engine


def _automatic(ndev: int, mesh, axis: str, platform: str, cyclic: bool, caller: str) -> Engine:
    portable = ENGINES["jax"]
    native = ENGINES["mg"]
    if ndev == 1 and not cyclic:
        return portable
    if native.platforms is not None and platform not in native.platforms:
        return portable  # no native engine there
    if not native.available():
        return portable
    engine = _native_choice(ndev, mesh, platform)
    return engine if engine.can_run(mesh, (axis,), platform, caller) is None else portable


def _native_choice(ndev: int, mesh, platform: str) -> Engine:
    """The native engine for a call of ``ndev`` devices: the distributed one past cuSolverMg's
    device limit or across hosts, else cuSolverMg."""
    limit = ENGINES["mg"].max_devices(platform)
    if limit is not None and ndev > limit:
        return ENGINES["mp"]
    if jax.process_count() == 1:
        return ENGINES["mg"]
    hosts = processes.job().hosts
    if isinstance(mesh, jax.sharding.Mesh):
        owners = {d.process_index for d in mesh.devices.flat}
    else:
        owners = range(jax.process_count())
    return ENGINES["mp"] if len({hosts[p] for p in owners}) > 1 else ENGINES["mg"]


def _refused(engine: Engine, mesh, axes, platform: str, caller: str) -> None:
    """Raises when ``engine``, asked for by name, cannot run the call: an ImportError when it
    is not installed, else a ValueError saying why and naming an engine that runs it."""
    if not engine.available():
        engine.handlers(caller)
    reason = engine.can_run(mesh, axes, platform, caller)
    if reason is None:
        return

    def runs(other):
        try:
            return other.can_run(mesh, axes, platform, caller) is None
        except NotImplementedError:  # runs only where asked for (jaxmg.describe.processes)
            return False

    others = [e for e in ENGINES.values() if e is not engine and (len(axes) == 1 or e.takes_grid)]
    other = next((e for e in others if runs(e)), None)
    alternative = "" if other is None else f"; backend={other.name!r} runs this call"
    raise ValueError(reason.rstrip(". ") + alternative + ".")


def _grid_engine(engine: Engine | None, row_axis: str, axis: str, what: str, caller: str):
    """The engine of ``A`` sharded over a process grid: the one asked for, if it takes grids."""
    gridded = [e for e in ENGINES.values() if e.takes_grid]
    if engine is None:
        return gridded[0]
    if not engine.takes_grid:
        names = " or ".join(f"backend={e.name!r}" for e in gridded)
        raise ValueError(
            f"{caller}: {what} is sharded over a process grid P({row_axis!r}, {axis!r}), which "
            f"only {names} (ScaLAPACK's 2D block-cyclic layout) solves on; "
            f"backend={engine.name!r} ({engine.summary}) takes P(None, ax) or P(ax, None)."
        )
    return engine


def geometry(
    mesh,
    axis: str,
    form: sharding.Form,
    platform: str,
    engine: Engine | None,
    caller: str,
    *,
    row_axis: str | None = None,
    cyclic: bool = False,
    what: str = "A",
) -> Geometry:
    """The :class:`~jaxmg.describe.Geometry` of a call on ``axis`` (``P(row_axis,
    axis)`` for ``form="grid"``): its engine chosen, which says how many devices take part and
    which, after checking it can run there."""
    if form == "grid":
        engine = _grid_engine(engine, row_axis, axis, what, caller)
        axes = (row_axis, axis)
        _refused(engine, mesh, axes, platform, caller)
    else:
        axes = (axis,)
        if engine is not None:
            _refused(engine, mesh, axes, platform, caller)
        engine = choose(engine, mesh, axis, platform, cyclic=cyclic, caller=caller)
    ndev, device_ids, job, pids = engine.participants(mesh, axes, platform, caller)
    return Geometry(
        mesh, axis, form, ndev, platform, device_ids, job, pids, engine=engine, row_axis=row_axis
    )


def resolve(a, mesh=None, in_spec=None, *, argname="A", backend=None, caller="jaxmg", cyclic=False):
    """Where ``a`` is solved, and by which engine: :func:`jaxmg.describe.sharding.placement`,
    then :func:`geometry` (``backend`` already checked: an :class:`Engine` or ``None``; a name is
    checked here). ``cyclic``: ``a`` is in the block-cyclic layout (``cyclic_1d=True``)."""
    if backend is None or isinstance(backend, str):
        backend = asked(backend, caller)
    mesh, axis, form, row_axis, platform = sharding.placement(a, mesh, in_spec, argname=argname)
    return geometry(
        mesh, axis, form, platform, backend, caller, row_axis=row_axis, cyclic=cyclic, what=argname
    )


def locate(A, mesh, spec, backend, caller, cyclic=False):
    """Where a global ``A`` is solved (:func:`resolve`, ``backend`` checked), with the engine's
    libraries opened."""
    checks.global_arrays(caller)
    where = resolve(A, mesh, spec, backend=asked(backend, caller), caller=caller, cyclic=cyclic)
    where.engine.load(caller, where.platform)
    return where
