"""One call's description, and the route of its local blocks.

:class:`Geometry` is where ``A`` lives and the engine that solves there. :class:`Call` is what every
program and every local body takes: the tile, ``N``, whether ``A`` is in the block-cyclic layout
already, the relayout, the geometry, the public function's name for its messages (``caller``) and
the checked layout. :func:`of_square` makes one for a square ``A`` (:func:`layout`: the engine's
tile, checked; :func:`describe`: the call). A call's :class:`Route` (:class:`GridRoute` over a
process grid) takes each device's block of ``A`` to the native target and its results back (steps 1
to 3 of :mod:`jaxmg.programs.routines`' docstring).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import jaxmg_layout

from . import checks
from .sharding import Form


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
      platform: ``"cpu"``, ``"gpu"`` (CUDA), or another JAX platform (backend ``"jax"``).
      device_ids: the participating devices in mesh-position order (CUDA ordinals on GPU, device
        ids on CPU), or ``UNKNOWN_DEVICE`` entries when only the abstract mesh is known.
      job: 0 when this process drives every device of the axis; else the multi-process mode
        (one device per process, one host) and the token the job's processes agreed on.
      pids: in the multi-process mode, the process id of each mesh position.
      engine: the engine that solves (:class:`jaxmg.engines.base.Engine`), chosen by
        :func:`jaxmg.engines.choose`; everything that differs between engines is asked of it.
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
    engine: object = None
    row_axis: str | None = None

    @property
    def backend(self) -> str:
        """The engine's name (``backend=``'s value)."""
        return self.engine.name

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
        """The engine's own attributes of the native call (the multi-process ones, the process
        grid)."""
        return self.engine.job_attributes(self)

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


@dataclasses.dataclass(frozen=True)
class Call:
    """What every program and local body of one matrix takes statically."""

    T_A: int
    n: int
    cyclic: bool
    relayout: str
    geometry: Geometry
    caller: str
    #: The layout (:class:`jaxmg_layout.CyclicPlan`, or :class:`jaxmg_layout.BlockCyclic2D`
    #: over a process grid) that :func:`layout` or :func:`checks.grid_plan` checked.
    plan: object = None

    def route(self) -> Route | GridRoute:
        """The route of this call's local blocks to the native target and back."""
        if self.geometry.form == "grid":
            return GridRoute(self)
        return Route(self)

    def native(self):
        """The engine's wrappers (:meth:`jaxmg.engines.base.Engine.routines`)."""
        return self.geometry.engine.routines(self.geometry.platform, self.caller)

    def position(self):
        return self.geometry.position()

    def native_kw(self, route) -> dict:
        """The keyword arguments every native wrapper takes for this call and route."""
        return dict(
            T_A=route.plan.tile,
            device_ids=self.geometry.device_ids,
            **self.geometry.native_job,
            **route.native_layout,
        )

    def conj(self, v):
        """The solver sees ``conj(A)`` (``A^T`` for LU) when ``A`` is sharded by rows."""
        return jnp.conj(v) if self.geometry.form == "rows" else v

    def shard_map(self, body, in_specs, out_specs):
        return jax.shard_map(
            body,
            mesh=self.geometry.mesh,
            in_specs=in_specs,
            out_specs=out_specs,
            check_vma=False,
        )


def describe(T_A, n, cyclic_1d, relayout, geometry, caller, plan=None) -> Call:
    """The :class:`Call` of checked arguments and their checked layout ``plan`` (on an engine
    that takes the whole matrix, which relays nothing, ``relayout`` has one value: the same
    program for both)."""
    return Call(
        T_A=T_A,
        n=n,
        cyclic=bool(cyclic_1d),
        relayout="native" if geometry.engine.whole else relayout,
        geometry=geometry,
        caller=caller,
        plan=plan,
    )


def layout(T_A, n, geometry, pad, routine, caller) -> jaxmg_layout.CyclicPlan:
    """The checked layout of a call (its ``T_A``: as asked, or chosen for ``None``); raises for
    ``pad=False`` with a tile that would widen A's blocks. The engine chooses the tile
    (:meth:`jaxmg.engines.base.Engine.tile`)."""
    T_A = geometry.engine.tile(T_A, n, geometry.ndev, routine, geometry.platform, caller, pad)
    plan = checks.plan(n, geometry.ndev, T_A, caller)
    checks.unpadded(pad, plan, caller)
    return plan


def of_square(a, n, T_A, cyclic_1d, relayout, pad, geometry, routine, caller) -> Call:
    """The :class:`Call` of a square ``A`` checked by :func:`checks.square_matrix` (``N`` from
    there, or ``None`` for a block-cyclic ``A``) on its ``geometry``: the tile, the layout."""
    if geometry.form == "grid":
        if cyclic_1d:
            raise ValueError(
                f"{caller}: cyclic_1d=True is the 1D layout of P(None, ax) or P(ax, None); pass A "
                "sharded P(r, c) in JAX's block sharding (jaxmg lays it out itself)."
            )
        plan = checks.grid_plan(n, geometry.grid, T_A, pad, caller)
        return describe(plan.tile, n, False, relayout, geometry, caller, plan)
    if cyclic_1d:
        n = checks.cyclic_shape(a, geometry, T_A, caller)
    plan = layout(T_A, n, geometry, pad, routine, caller)
    return describe(plan.T_A, n, cyclic_1d, relayout, geometry, caller, plan)


# --- the route of a call's local blocks -----------------------------------------------------------


class Route:
    """How one local block reaches the native target (step 2) and how its result comes back.

    ``relayout="native"``: the block goes to the target as it is (column blocks transposed,
    placed in a buffer of the width :func:`jaxmg_layout.in_place_moves` asks for), and the
    target's leader moves the columns to the block-cyclic layout in place and back: no second
    copy of ``A``. On backend ``"mp"`` the block goes to the engine as it is, which
    redistributes it to its tiles and back (ScaLAPACK's p?gemr2d; ``blocks``); cuSOLVERMp has
    no such routine, so on GPUs the relayout is JAX's. ``relayout=
    "jax"``: the relayout runs here, as JAX collectives
    (:func:`jaxmg_layout.cyclic_1d_no_shardmap`). ``cyclic``: the block is already cyclic.
    """

    def __init__(self, call: Call):
        self.T_A, self.n, self.geometry, self.cyclic = call.T_A, call.n, call.geometry, call.cyclic
        geometry = call.geometry
        self.plan = call.plan or jaxmg_layout.CyclicPlan.make(call.n, geometry.ndev, call.T_A)
        native = call.relayout == "native" and not call.cyclic and self.plan.needs_relayout
        # The engine's leader moves tiles in place, or it redistributes the blocks itself.
        in_place = native and geometry.engine.moves_in_place
        self.moves = jaxmg_layout.in_place_moves(self.plan) if in_place else None
        self.blocks = native and geometry.engine.relays_blocks(geometry.platform)
        # What the native target needs to know of the local array's layout beyond its shape
        # (it reads N from the shape): whether it is a block of A that the engine relays.
        self.native_layout = {"blocks": True} if self.blocks else {}

    @property
    def native_moves(self):
        """The ``moves`` argument of the native wrappers."""
        return None if self.moves is None else (self.moves.to_cyclic, self.moves.from_cyclic)

    def _rows(self, a):
        return a.T if self.geometry.form == "cols" else a

    def _offset(self):
        return jnp.asarray(self.moves.offsets)[jax.lax.axis_index(self.geometry.axis)]

    def to_native(self, a):
        """Local block of A -> the ``[L, N]`` (or ``[W, N]``) array the native target reads.

        For the jax relayout, the relayout runs in the caller's form and a column block is
        transposed last: on XLA:CPU a transpose fused into the relayout's slices reads with a
        stride, which costs more than the slices themselves.
        """
        if self.moves is None:
            if not (self.cyclic or self.blocks):
                a = jaxmg_layout.cyclic_1d_no_shardmap(
                    a, self.T_A, self.geometry.axis, axis=self.geometry.sharded_dim
                )
            return self._rows(a)
        rows = self._rows(a)
        width, s = self.moves.width, self.plan.shard_size
        if not self.moves.offsets.any():
            return rows if width == s else jnp.pad(rows, ((0, width - s), (0, 0)))
        room = jnp.zeros((width, self.n), rows.dtype)
        return jax.lax.dynamic_update_slice(room, rows, (self._offset(), 0))

    def from_native(self, z, then=None):
        """A native result -> the block layout and form of the caller's A.

        ``then``, if given, runs on the block-layout result while it is still in the native
        ``[s, N]`` row form, before a column block's transpose.
        """
        s = self.plan.shard_size
        if self.blocks:
            pass  # the engine wrote the result into the block
        elif self.moves is None:
            z = jaxmg_layout.undo_cyclic_1d_no_shardmap(
                z, self.T_A, self.n, self.geometry.axis, axis=0
            )
        elif self.moves.offsets.any():
            z = jax.lax.dynamic_slice_in_dim(z, self._offset(), s, axis=0)
        else:
            z = z[:s]
        return self._rows(z if then is None else then(z))


class GridRoute:
    """:class:`Route` for ``A`` sharded over a process grid ``P(r, c)`` (backend ``"mp"``): a
    local transpose to the engine's column-major ``[N/cols, N/rows]`` block, which the engine
    redistributes to its tiles itself (``relayout="native"``: ScaLAPACK's p?gemr2d); or, with
    ``relayout="jax"``, the 2D relayout first (:func:`jaxmg_layout.cyclic_2d_no_shardmap`), as
    JAX collectives, to the local array ``[Lc, Lr]`` (on GPUs always: cuSOLVERMp has no
    redistribution). A tile as wide as the blocks needs neither."""

    moves = None
    native_moves = None

    def __init__(self, call: Call):
        self.T_A, self.n, self.geometry = call.T_A, call.n, call.geometry
        geometry = call.geometry
        self.plan = call.plan or jaxmg_layout.BlockCyclic2D.for_blocks(
            call.n, geometry.grid, call.T_A
        )
        shard = self.plan.shard_shape
        moves = any(p > 1 and self.plan.tile < s for p, s in zip(geometry.grid, shard, strict=True))
        self.blocks = (
            moves and call.relayout == "native" and geometry.engine.relays_blocks(geometry.platform)
        )
        self.relaid = moves and not self.blocks
        # N (the engine cannot read it from a local array's shape), and whether the local array
        # is a block of A that the engine relays.
        self.native_layout = {"n": call.n, "blocks": True} if self.blocks else {"n": call.n}

    def to_native(self, a):
        if self.relaid:
            a = jaxmg_layout.cyclic_2d_no_shardmap(a, self.T_A, self.geometry.axes)
        return a.T

    def from_native(self, z):
        if self.relaid:
            return jaxmg_layout.undo_cyclic_2d_no_shardmap(
                z.T, self.T_A, self.n, self.geometry.axes
            )
        return z.T
