"""One call's description, and the route of its local blocks.

:class:`Call` is what every program and every local body takes: the tile, ``N``, whether ``A``
is in the block-cyclic layout already, the relayout, where ``A`` lives (:class:`Geometry`), and
the public function's name for its messages (``caller``). :func:`describe` makes one from the
checked arguments, :func:`layout` checks the tile. A call's :class:`Route` (:class:`GridRoute`
over a process grid) takes each device's block of ``A`` to the native target and its results
back (steps 1 to 3 of :mod:`jaxmg._programs`' docstring).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import jaxmg_layout

from . import _geometry, _native, _validate
from ._geometry import Geometry


@dataclasses.dataclass(frozen=True)
class Call:
    """What every program and local body of one matrix takes statically."""

    T_A: int
    n: int
    cyclic: bool
    relayout: str
    geometry: Geometry
    caller: str

    def route(self) -> Route | GridRoute:
        """The route of this call's local blocks to the native target and back."""
        if self.geometry.form == "grid":
            return GridRoute(self)
        return Route(self)

    def native(self):
        """The engine's wrappers (:func:`jaxmg._native.engine`)."""
        return _native.engine(self.geometry.platform, self.caller, self.geometry.backend)

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


def locate(A, mesh, spec, backend, caller, cyclic=False) -> tuple[Geometry, np.dtype]:
    """The checks of every function on a global ``A`` before its own: the backend and ``A``'s
    dtype, then where ``A`` is solved (:func:`jaxmg._geometry.resolve`), with the distributed
    engine loaded when it runs. Returns ``(geometry, A's dtype)``."""
    backend = _validate.backend(backend, caller)
    dtype = _validate.matrix_dtype(A, caller)
    geometry = _geometry.resolve(A, mesh, spec, backend=backend, caller=caller, cyclic=cyclic)
    if geometry.backend == "mp":
        _native.load_mp(caller, geometry.platform)
    return geometry, dtype


def describe(T_A, n, cyclic_1d, relayout, geometry, caller) -> Call:
    """The :class:`Call` of checked arguments, ``relayout`` checked (on backend ``"jax"``,
    which relays nothing, one value: the same program for both)."""
    relayout = _validate.relayout(relayout, caller)
    return Call(
        T_A=T_A,
        n=n,
        cyclic=bool(cyclic_1d),
        relayout="native" if geometry.backend == "jax" else relayout,
        geometry=geometry,
        caller=caller,
    )


def layout(T_A, n, geometry, pad, routine, caller) -> jaxmg_layout.CyclicPlan:
    """The checked layout of a call (its ``T_A``: as asked, or chosen for ``None``); raises for
    ``pad=False`` with a tile that would widen A's blocks. Backend ``"jax"`` (one device, JAX's
    dense solvers) takes the whole matrix as one tile whatever ``T_A`` was asked for."""
    if geometry.backend == "jax":
        T_A = n
    else:
        T_A = _validate.resolve_tile(
            T_A, n, geometry.ndev, routine, geometry.platform, caller, geometry.backend, pad
        )
    plan = _validate.plan(n, geometry.ndev, T_A, caller)
    _validate.unpadded(pad, plan, caller)
    return plan


# --- the route of a call's local blocks -----------------------------------------------------------


def engine_relays_blocks(geometry) -> bool:
    """Whether the native target takes a block of ``A`` and relays it to its tiles itself:
    backend ``"mp"`` on CPUs (ScaLAPACK's p?gemr2d). cuSOLVERMp has no such routine."""
    return geometry.backend == "mp" and geometry.platform != "gpu"


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
        self.plan = jaxmg_layout.CyclicPlan.make(call.n, geometry.ndev, call.T_A)
        native = call.relayout == "native" and not call.cyclic and self.plan.needs_relayout
        # "mg": the leader moves tiles in place; "mp": the engine redistributes the blocks
        # (ScaLAPACK's p?gemr2d; cuSOLVERMp has none: JAX relays them on GPUs).
        in_place = native and geometry.backend == "mg"
        self.moves = jaxmg_layout.in_place_moves(self.plan) if in_place else None
        self.blocks = native and engine_relays_blocks(geometry)
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
        self.plan = jaxmg_layout.BlockCyclic2D.for_blocks(call.n, geometry.grid, call.T_A)
        shard = self.plan.shard_shape
        moves = any(p > 1 and self.plan.tile < s for p, s in zip(geometry.grid, shard, strict=True))
        self.blocks = moves and call.relayout == "native" and engine_relays_blocks(geometry)
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
