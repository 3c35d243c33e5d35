"""Where a call's matrix lives, and putting arrays there.

:func:`placement` runs at trace time, in Python, before any device work: it reads the sharding
of ``A`` (or the ``mesh``/``in_specs`` the caller gave), checks that it is a form jaxmg accepts,
and returns its mesh, solver axis, form and platform, from which :func:`jaxmg.engines.geometry`
makes the call's :class:`jaxmg.describe.call.Geometry`. :func:`_placed` puts an array, concrete
or traced, in a sharding over a mesh.
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.extend.core
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

Form = Literal["cols", "rows", "grid"]


_ACCEPTED = (
    "A sharded over exactly one mesh axis, by columns P(None, ax) or by rows P(ax, None), or "
    "(backend='mp') over a process grid P(r, c)"
)


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


def platform_of(mesh) -> str:
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


def placement(a, mesh=None, in_spec=None, *, argname: str = "A"):
    """``(mesh, axis, form, row_axis, platform)`` of ``a`` from ``mesh``/``in_spec`` or from
    its sharding; the engine that solves there is chosen by :func:`jaxmg.engines.resolve`.

    ``in_spec``, when given, decides where ``a`` goes (the caller then places it so, whatever
    its sharding now); else ``a``'s own sharding does. ``mesh`` as in :func:`_solver_mesh`.

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
    return mesh, axis, form, row_axis, platform_of(mesh)


def _placed(x, mesh, spec):
    """``x`` sharded as ``spec`` over ``mesh`` (a no-op when it already is), from any sharding.

    A concrete array goes there with ``device_put`` (from any devices). A traced one: with
    ``reshard`` where the axes are Explicit, with a sharding constraint where they are Auto
    (``reshard`` refuses Auto axes). Not ``device_put`` on Explicit axes: under ``jax.vmap`` it
    puts the batch dimension last in the sharding (P(None, 'x') becomes P(None, 'x', None)),
    which jax 0.12's ``shard_map`` no longer repairs.

    A traced value is not always under ``jit``: an eager derivative's operands are traced and
    every operation on them runs at once. On an abstract mesh (``jax.set_mesh``'s, when ``A``
    carries none) ``reshard`` then takes the devices of ``jax.set_mesh``, and the sharding
    constraint, which cannot, runs as a program of its own (:func:`_constrained`).
    """
    sharding = NamedSharding(mesh, spec)
    if not is_tracer(x) and isinstance(mesh, jax.sharding.Mesh):
        if getattr(x, "sharding", None) == sharding:
            return x  # the common case, and device_put's own no-op costs tens of microseconds
        return jax.device_put(x, sharding)
    if _explicit(mesh, spec):
        return jax.sharding.reshard(x, sharding)
    if isinstance(mesh, jax.sharding.AbstractMesh):
        return _constrained(x, sharding)
    return jax.lax.with_sharding_constraint(x, sharding)


@functools.partial(jax.jit, static_argnums=1)
def _constrained(x, sharding):
    """``x`` under a sharding constraint to an abstract mesh, as a jitted program: run eagerly,
    it is lowered on ``jax.set_mesh``'s devices (the constraint alone, run eagerly, refuses an
    array that is not already on the mesh); under ``jit`` it is inlined."""
    return jax.lax.with_sharding_constraint(x, sharding)


def _explicit(mesh, spec) -> bool:
    """Whether the mesh axes ``spec`` names (every axis, for a replicated spec) are Explicit."""
    types = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
    names = [
        n
        for entry in spec
        if entry is not None
        for n in (entry if isinstance(entry, tuple) else (entry,))
    ]
    return all(types[n] == jax.sharding.AxisType.Explicit for n in (names or mesh.axis_names))
