"""The public functions called inside a user's ``jax.shard_map``, on local blocks:
``potrs_no_shardmap``, ``potri_no_shardmap``, ``syevd_no_shardmap`` (jaxmg 0.0.x's names for
them, ``*_shardmap_ctx``: :mod:`jaxmg.compat.shardmap_ctx`).

Here too is the geometry of local blocks, where only the enclosing ``shard_map``'s abstract mesh
is known (:func:`_from_abstract_mesh`, :func:`_grid_from_abstract_mesh`). Each function
validates the local block and its arguments against that mesh (:func:`_local_statics`, with
the checks of :mod:`jaxmg.describe`) and runs the local body of its routine
(:mod:`jaxmg.programs.local`) right there, in the caller's ``shard_map``: no program of its own.
It runs whether that ``shard_map`` checks replication (``check_vma=True``, JAX's default) or
not, and its derivatives are the global function's, from the rules on local blocks of
:mod:`jaxmg.programs.derivatives` (``potrs_local``, ``potri_local``, ``syevd_local``; none on a
process grid). The functions on global arrays refuse to run inside a ``shard_map``
(:func:`jaxmg.describe.checks.global_arrays`) and name the one here to call instead.
"""

from __future__ import annotations

from typing import Any, Literal

import jax

from .. import engines
from ..describe import checks, sharding
from ..describe.call import Geometry, describe, layout
from ..describe.checks import Backend, Relayout, Result
from ..programs.derivatives import potri_local, potrs_local, syevd_local
from ..programs.local import (
    _hermitian_blocks_from_lower,
    _potri_local,
    _potrs_local,
    _syevd_local,
)

# --- inside a user's shard_map --------------------------------------------------------------------


def in_shard_map() -> bool:
    """Whether the caller runs inside a ``jax.shard_map`` (on local blocks)."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and bool(mesh.manual_axes)


def _enclosing_shard_map():
    """``(abstract mesh, its manual axes)`` of the enclosing ``shard_map``, or an error."""
    mesh = jax.sharding.get_abstract_mesh()
    manual = mesh.manual_axes if not mesh.empty else ()
    if not manual:
        raise ValueError(
            "no enclosing shard_map: the *_no_shardmap / *_shardmap_ctx functions must be "
            "called inside jax.shard_map on local blocks (else call jaxmg.potrs/potri/syevd)."
        )
    return mesh, manual


def _grid_from_abstract_mesh(axes, backend=None, caller: str = "jaxmg") -> Geometry:
    """The geometry of local blocks of a matrix sharded ``P(r, c)`` over ``axes = (r, c)``,
    inside a user's ``shard_map``."""
    mesh, manual = _enclosing_shard_map()
    for name in axes:
        if name not in manual:
            raise ValueError(
                f"{caller}: axis_name={tuple(axes)!r} names {name!r}, which is not an axis of the "
                f"enclosing shard_map (axes: {manual})."
            )
    row_axis, axis = axes
    platform = sharding.platform_of(mesh)
    return engines.geometry(
        mesh, axis, "grid", platform, backend, caller, row_axis=row_axis, what="the matrix"
    )


def _from_abstract_mesh(
    axis_name: str | None,
    form: sharding.Form,
    fits,
    backend=None,
    caller: str = "jaxmg",
    cyclic: bool = False,
) -> Geometry:
    """The geometry inside a user's ``shard_map``, where only the abstract mesh is known.

    ``axis_name=None`` picks the one mesh axis whose size ``fits(size)`` says the local block
    is split over (jaxmg 0.0.x's ``*_shardmap_ctx`` functions took no axis name). ``cyclic``
    as for :func:`resolve`.
    """
    mesh, manual = _enclosing_shard_map()
    if axis_name is None:
        names = [name for name in manual if fits(dict(mesh.shape)[name])]
        if len(names) != 1:
            raise ValueError(
                f"cannot tell which axis of the enclosing shard_map (axes {manual}) the local "
                "block is split over"
                + (f" ({names} all fit)" if names else " (none fits its shape)")
                + "; pass axis_name=."
            )
        axis_name = names[0]
    if axis_name not in manual:
        raise ValueError(
            f"axis_name={axis_name!r} is not an axis of the enclosing shard_map (axes: "
            f"{manual}); the *_no_shardmap functions must be called inside jax.shard_map on "
            "local blocks."
        )
    platform = sharding.platform_of(mesh)
    return engines.geometry(mesh, axis_name, form, platform, backend, caller, cyclic=cyclic)


def _local_statics(
    a, T_A, cyclic_1d, axis_name, sharded_by, relayout, pad, routine, caller, backend=None
):
    """Validate a local block and the arguments; the :class:`jaxmg.describe.call.Call` of the local
    bodies."""
    backend = engines.asked(backend, caller)
    relayout = checks.relayout(relayout, caller)
    if sharded_by == "grid":
        return _grid_local_statics(
            a, T_A, cyclic_1d, axis_name, relayout, pad, routine, caller, backend
        )
    if sharded_by not in ("cols", "rows"):
        raise ValueError(
            f"{caller}: sharded_by must be 'cols', 'rows' or 'grid' (P(r, c), backend 'mp'), got "
            f"{sharded_by!r}."
        )
    checks.matrix_dtype(a, caller, argname="a")
    T_A = checks.tile_size(T_A, caller, cyclic_1d)
    dim = 1 if sharded_by == "cols" else 0
    n, width = int(a.shape[1 - dim]), int(a.shape[dim])

    def fits(ndev):  # the axis this local block is split over
        if n % ndev:
            return False
        if not cyclic_1d:
            return width * ndev == n
        return checks.plan(n, ndev, T_A, caller).local_width == width

    geometry = _from_abstract_mesh(
        axis_name, sharded_by, fits, backend, caller, cyclic=bool(cyclic_1d)
    )
    geometry.engine.load(caller, geometry.platform)
    plan = layout(T_A, n, geometry, pad, routine, caller)
    expected = plan.local_width if cyclic_1d else plan.shard_size
    if width != expected:
        raise ValueError(
            f"{caller}: local block of shape {tuple(a.shape)} does not match N={n} over "
            f"{geometry.ndev} devices along {geometry.axis!r}"
            + (f" in the block-cyclic layout (width {expected})" if cyclic_1d else "")
            + f"; expected {expected} {geometry.form} per device."
        )
    return describe(plan.T_A, n, cyclic_1d, relayout, geometry, caller, plan)


def _grid_local_statics(a, T_A, cyclic_1d, axis_name, relayout, pad, routine, caller, backend):
    """:func:`_local_statics` for the block ``[N/rows, N/cols]`` of a matrix sharded
    ``P(r, c)``, ``axis_name=(r, c)``."""
    if not (
        isinstance(axis_name, (tuple, list))
        and len(axis_name) == 2
        and all(isinstance(name, str) for name in axis_name)
    ):
        raise ValueError(
            f"{caller}: sharded_by='grid' needs axis_name=(r, c), the mesh axes of the process "
            f"rows and columns of the enclosing shard_map; got axis_name={axis_name!r}."
        )
    if cyclic_1d:
        raise ValueError(
            f"{caller}: cyclic_1d=True is a 1D layout; sharded_by='grid' takes blocks."
        )
    checks.matrix_dtype(a, caller, argname="a")
    T_A = checks.tile_size(T_A, caller)
    geometry = _grid_from_abstract_mesh(tuple(axis_name), backend, caller)
    geometry.engine.load(caller, geometry.platform)
    rows, cols = geometry.grid
    n = int(a.shape[0]) * rows
    if a.ndim != 2 or a.shape[1] * cols != n:
        raise ValueError(
            f"{caller}: local block of shape {tuple(a.shape)} is not one of a square matrix on the "
            f"{rows} x {cols} grid {tuple(axis_name)}: expected [N/{rows}, N/{cols}]."
        )
    if routine == "potri" and rows != cols:
        raise ValueError(
            f"{caller}: on a {rows} x {cols} grid the blocks above the diagonal are not the "
            "transposes of blocks below it, so potri_no_shardmap takes square grids only; call "
            "jaxmg.potri on the global array instead."
        )
    plan = checks.grid_plan(n, geometry.grid, T_A, pad, caller)
    return describe(plan.tile, n, False, relayout, geometry, caller, plan)


def _potrs_blocks(a, b, call):
    """potrs on local blocks: ``b`` (``[N]`` or ``[N, nrhs]``) checked, ``x`` in its shape."""
    dtype = checks.matrix_dtype(a, call.caller, "a")
    b_shape = checks.rhs_shape(b, call.n, dtype, call.caller)
    solve = _potrs_local if call.geometry.form == "grid" else potrs_local
    x, status = solve(call, a, b.reshape(call.n, -1))
    return x.reshape(b_shape), status


def _potri_blocks(call, a):
    """potri on local blocks: the inverse's block in the form (and layout) of ``a``."""
    if call.geometry.form == "grid":  # the lower triangle: fill the upper one
        inv, status = _potri_local(call, a)
        return _hermitian_blocks_from_lower(inv, call.geometry), status
    return potri_local(call, a)


def _syevd_blocks(call, a, vectors, v_columns=False):
    """syevd on local blocks: ``(w, v_block, status)`` or ``(w, status)``."""
    if call.geometry.form == "grid":
        return _syevd_local(call, a, vectors, v_columns=v_columns)
    return syevd_local(call, vectors, v_columns, a)


def potrs_no_shardmap(
    a: jax.Array,
    b: jax.Array,
    T_A: int | None = None,
    *positional: Any,
    cyclic_1d: bool = False,
    axis_name: str | tuple[str, str] | None = None,
    sharded_by: Literal["cols", "rows", "grid"] = "cols",
    pad: bool = True,
    relayout: Relayout = "native",
    backend: Backend = None,
) -> Result:
    """:func:`potrs` on local blocks, called inside the caller's ``jax.shard_map``.

    Args:
      a: this device's block of ``A``: ``[N, N/ndev]`` columns (``sharded_by="cols"``, the
        default) or ``[N/ndev, N]`` rows (``sharded_by="rows"``); in the block-cyclic layout
        when ``cyclic_1d``. Or, with ``sharded_by="grid"`` (backend ``"mp"``), its block
        ``[N/rows, N/cols]`` of ``P(r, c)``, with ``axis_name=(r, c)``.
      b: ``[N]`` or ``[N, nrhs]``, the same on every device.
      T_A, pad, relayout, backend: as for :func:`potrs` (``backend="mp"``: the enclosing
        ``shard_map``'s axis must hold one device of every process of the job).
      axis_name: the mesh axis the blocks are split over; default: the one axis of the
        enclosing ``shard_map`` whose size fits the block. For ``sharded_by="grid"``, the
        pair ``(r, c)`` of the process rows' and columns' axes (required).

    Returns:
      ``(x, status)``: ``x`` like ``b``, the same on every device; ``status`` int32 ``[1]``
      (0 or ``k > 0``, as in :func:`potrs`). Always returns the status.
    """
    caller = "jaxmg.potrs_no_shardmap"
    checks.keyword_only(caller, positional, "cyclic_1d (the original README's jaxmg)")
    call = _local_statics(
        a, T_A, cyclic_1d, axis_name, sharded_by, relayout, pad, "potrs", caller, backend
    )
    return _potrs_blocks(a, b, call)


def potri_no_shardmap(
    a: jax.Array,
    T_A: int | None = None,
    *positional: Any,
    cyclic_1d: bool = False,
    axis_name: str | tuple[str, str] | None = None,
    sharded_by: Literal["cols", "rows", "grid"] = "cols",
    pad: bool = True,
    relayout: Relayout = "native",
    backend: Backend = None,
) -> Result:
    """:func:`potri` on local blocks inside ``jax.shard_map``; returns ``(inverse_block, status)``.

    The returned block is this device's block of the full Hermitian inverse, in the same form
    (and layout) as ``a``; ``status`` int32 ``[1]``. Arguments as for
    :func:`potrs_no_shardmap`; ``sharded_by="grid"`` takes square grids only.
    """
    caller = "jaxmg.potri_no_shardmap"
    checks.keyword_only(caller, positional, "cyclic_1d (the original README's jaxmg)")
    call = _local_statics(
        a, T_A, cyclic_1d, axis_name, sharded_by, relayout, pad, "potri", caller, backend
    )
    return _potri_blocks(call, a)


def syevd_no_shardmap(
    a: jax.Array,
    T_A: int | None = None,
    *positional: Any,
    return_eigenvectors: bool = True,
    cyclic_1d: bool = False,
    axis_name: str | tuple[str, str] | None = None,
    sharded_by: Literal["cols", "rows", "grid"] = "cols",
    pad: bool = True,
    relayout: Relayout = "native",
    backend: Backend = None,
) -> Result:
    """:func:`syevd` on local blocks inside ``jax.shard_map``.

    Returns ``(w, v_block, status)`` with eigenvectors, else ``(w, status)``; ``w`` is the same
    on every device, ``v_block`` this device's block of ``V`` in the same form as ``a``,
    ``status`` int32 ``[1]``. Arguments as for :func:`potrs_no_shardmap`; a GPU tile over 1024
    is lowered to 1024 with a ``UserWarning``.
    """
    caller = "jaxmg.syevd_no_shardmap"
    checks.keyword_only(caller, positional, "return_eigenvectors, e.g. return_eigenvectors=False")
    call = _local_statics(
        a, T_A, cyclic_1d, axis_name, sharded_by, relayout, pad, "syevd", caller, backend
    )
    return _syevd_blocks(call, a, bool(return_eigenvectors))
