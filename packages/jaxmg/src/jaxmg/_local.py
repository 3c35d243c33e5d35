"""The local side of every program: where arrays go, and what runs on one device's blocks.

Placement: :func:`_placed` puts an array, concrete or traced, in a sharding over a mesh.

Inside ``jax.shard_map``, on each device's block of ``A`` (the shard_map programs run these, and
so do the functions called inside a user's ``shard_map``, such as ``potrs_no_shardmap``):

- the route of a block to the native target and back: :class:`_Route` for ``A`` sharded by
  columns or rows, :class:`_GridRoute` for a process grid (steps 1 to 3 of
  :mod:`jaxmg._programs`' docstring);
- the Hermitian fills and transposes across devices (:func:`_hermitian_from_triangle`,
  :func:`_transpose_rows`; :func:`_hermitian_from_lower`, on a global array, runs its own
  ``shard_map`` on a square grid);
- the local bodies of potrs, potri and syevd (:func:`_potrs_local`, :func:`_potri_local`,
  :func:`_syevd_local`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

import jaxmg_layout

from . import _geometry, _native

# --- local (per-device) building blocks, used inside shard_map ------------------------------


def _engine_relays_blocks(geometry) -> bool:
    """Whether the native target takes a block of ``A`` and relays it to its tiles itself:
    backend ``"mp"`` on CPUs (ScaLAPACK's p?gemr2d). cuSOLVERMp has no such routine."""
    return geometry.backend == "mp" and geometry.platform != "gpu"


class _Route:
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

    def __init__(self, T_A, n, geometry, cyclic, relayout):
        self.T_A, self.n, self.geometry, self.cyclic = T_A, n, geometry, cyclic
        self.plan = jaxmg_layout.CyclicPlan.make(n, geometry.ndev, T_A)
        native = relayout == "native" and not cyclic and self.plan.needs_relayout
        # "mg": the leader moves tiles in place; "mp": the engine redistributes the blocks
        # (ScaLAPACK's p?gemr2d; cuSOLVERMp has none: JAX relays them on GPUs).
        in_place = native and geometry.backend == "mg"
        self.moves = jaxmg_layout.in_place_moves(self.plan) if in_place else None
        self.blocks = native and _engine_relays_blocks(geometry)
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


class _GridRoute:
    """:class:`_Route` for ``A`` sharded over a process grid ``P(r, c)`` (backend ``"mp"``): a
    local transpose to the engine's column-major ``[N/cols, N/rows]`` block, which the engine
    redistributes to its tiles itself (``relayout="native"``: ScaLAPACK's p?gemr2d); or, with
    ``relayout="jax"``, the 2D relayout first (:func:`jaxmg_layout.cyclic_2d_no_shardmap`), as
    JAX collectives, to the local array ``[Lc, Lr]`` (on GPUs always: cuSOLVERMp has no
    redistribution). A tile as wide as the blocks needs neither."""

    moves = None
    native_moves = None

    def __init__(self, T_A, n, geometry, relayout):
        self.T_A, self.n, self.geometry = T_A, n, geometry
        self.plan = jaxmg_layout.BlockCyclic2D.for_blocks(n, geometry.grid, T_A)
        shard = self.plan.shard_shape
        moves = any(p > 1 and self.plan.tile < s for p, s in zip(geometry.grid, shard, strict=True))
        self.blocks = moves and relayout == "native" and _engine_relays_blocks(geometry)
        self.relaid = moves and not self.blocks
        # N (the engine cannot read it from a local array's shape), and whether the local array
        # is a block of A that the engine relays.
        self.native_layout = {"n": n, "blocks": True} if self.blocks else {"n": n}

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


def _route(T_A, n, geometry, cyclic, relayout):
    """The route of one call's local blocks to the native target and back."""
    if geometry.form == "grid":
        return _GridRoute(T_A, n, geometry, relayout)
    return _Route(T_A, n, geometry, cyclic, relayout)


def _hermitian_from_lower(x, geometry):
    """The Hermitian matrix whose lower triangle is the global ``x``'s (sharded ``P(r, c)``).

    On a square grid, inside ``shard_map`` (:func:`_hermitian_blocks_from_lower`). On another
    grid the blocks do not pair up across the diagonal, so the upper triangle comes from one
    resharded transpose of the strict lower one.
    """
    rows, cols = geometry.grid
    if rows == cols:
        fill = functools.partial(_hermitian_blocks_from_lower, geometry=geometry)
        spec = geometry.spec
        return jax.shard_map(
            fill, mesh=geometry.mesh, in_specs=spec, out_specs=spec, check_vma=False
        )(x)
    upper = _placed(jnp.conj(jnp.tril(x, -1)).T, geometry.mesh, geometry.spec)
    return jnp.tril(x) + upper


def _hermitian_blocks_from_lower(x, geometry):
    """:func:`_hermitian_from_lower` on the local block ``(i, j)`` of a square grid: a block
    above the diagonal (``i < j``) is the conjugate transpose of block ``(j, i)``, which one
    ``ppermute`` over both grid axes brings; a diagonal block fills itself."""
    rows, cols = geometry.grid
    i = jax.lax.axis_index(geometry.row_axis)
    j = jax.lax.axis_index(geometry.axis)
    pairs = [(a * cols + b, b * cols + a) for a in range(rows) for b in range(cols) if a != b]
    mirrored = jnp.conj(jax.lax.ppermute(x, geometry.axes, pairs)).T if pairs else x
    diagonal = jnp.tril(x) + jnp.conj(jnp.tril(x, -1)).T
    return jnp.where(i > j, x, jnp.where(i < j, mirrored, diagonal))


def _pairings(ndev):
    """Rounds of disjoint device pairs that meet every pair once (a round-robin tournament).

    The circle method: device ``m - 1`` stays put while the others rotate; for an odd count a
    phantom device ``ndev`` gives each round's partner of it a bye.
    """
    m = ndev + ndev % 2
    rounds = []
    for r in range(m - 1):
        pairs = [(r, m - 1)] + [((r + i) % (m - 1), (r - i) % (m - 1)) for i in range(1, m // 2)]
        rounds.append(tuple((min(p), max(p)) for p in pairs if max(p) < ndev))
    return [pairs for pairs in rounds if pairs]


def _mirror_blocks_below(x, axis_name):
    """Fill the blocks left of the diagonal of a row block from the conjugate transpose, in place.

    ``x = Z[blk_j, :]`` (``[s, N]``) on device ``j`` of ``ndev = N / s``; its block ``k`` is
    ``Z[blk_j, blk_k]``. Every block ``k < j`` becomes ``conj(Z[blk_k, blk_j])^T`` (block
    ``(j, k)`` of ``Z^H``). Devices meet in pairs (:func:`_pairings`), one ``ppermute`` of an
    ``s x s`` block per round, from the lower device of each pair to the higher, which
    overwrites the block it got it for. Each round reads what the one before wrote, so the
    updates are in place and one round's blocks are live at a time: no ``[s, N]`` temporary,
    where an ``all_to_all`` needs one (on XLA:CPU three).
    """
    s, n = x.shape
    ndev = n // s
    j = jax.lax.axis_index(axis_name)
    for pairs in _pairings(ndev):
        partner = list(range(ndev))  # a device without a partner this round keeps its own
        for lo, hi in pairs:
            partner[lo], partner[hi] = hi, lo
        k = jnp.asarray(partner, dtype=jnp.int32)[j]
        mine = jax.lax.dynamic_slice_in_dim(x, k * s, s, axis=1)
        received = jax.lax.ppermute(mine, axis_name, list(pairs))  # zeros where none arrives
        new = jnp.where(k < j, jnp.conj(received).T, mine)
        x = jax.lax.dynamic_update_slice_in_dim(x, new, k * s, axis=1)
    return x


def _transpose_rows(z, axis_name, conjugate=True):
    """The row block ``Z^H[blk, :]`` (``Z^T[blk, :]`` without ``conjugate``) from the row block
    ``Z[blk, :]`` (both ``[s, N]``).

    One ``all_to_all`` brings this device ``Z[:, blk]``; its (conjugate) transpose is the
    answer. Not an in-place pairwise swap like :func:`_mirror_blocks_below`: the diagonal block
    would be transposed in place, which XLA:CPU (jax 0.10-0.12) fuses into a loop that
    overwrites elements before their mirror images are read; and the two ``ppermute``s that
    would give it a buffer of its own made programs with several jaxmg calls starve XLA:CPU's
    threads.
    """
    other = jax.lax.all_to_all(z, axis_name, split_axis=1, concat_axis=0, tiled=True)
    return (jnp.conj(other) if conjugate else other).T


def _hermitian_from_triangle(x, axis_name):
    """Fill the triangle the solver left unspecified from the valid one, by Hermitian symmetry.

    ``x`` is the native ``[s, N]`` result, row ``i`` being the solver's column ``j*s + i`` on
    device ``j``; the native potri writes the solver's lower triangle, so ``x[i, r]`` is valid
    for ``r >= j*s + i``. That holds in both forms: read back as columns it is the lower
    triangle of ``inv(A)``, as rows the upper one (the solver saw ``conj(A) = A^T``). Working
    on the native rows leaves a column block's transpose to the caller's last step.
    """
    s = x.shape[0]
    x = _mirror_blocks_below(x, axis_name)
    # The diagonal block is filled in place from itself: safe however XLA fuses it, since each
    # element reads only itself or an element above the diagonal, which keeps its value. A sum
    # of masked terms (each element gets exactly one nonzero term), not one select between the
    # block and its transpose: XLA:CPU's optimising compiler takes seconds to minutes over
    # such a select in real dtypes (23 s for a 512-square float64 block, jax 0.10.2).
    first = jax.lax.axis_index(axis_name) * s
    block = jax.lax.dynamic_slice_in_dim(x, first, s, axis=1)
    rows = jnp.arange(s, dtype=jnp.int32)[:, None]
    cols = jnp.arange(s, dtype=jnp.int32)[None, :]
    upper = jnp.where(cols > rows, block, 0)
    diagonal = jnp.where(cols == rows, jnp.real(block).astype(x.dtype), 0)  # real: Hermitian
    block = upper + diagonal + jnp.conj(upper).T
    return jax.lax.dynamic_update_slice_in_dim(x, block, first, axis=1)


def _relayout(a, T_A, geometry):
    return jaxmg_layout.cyclic_1d_no_shardmap(a, T_A, geometry.axis, axis=geometry.sharded_dim)


def _potrs_local(a, b, *, T_A, n, cyclic, relayout, geometry, fn, with_factor=False):
    """Solve on local blocks. ``a``: local block of A; ``b``: replicated ``[N, nrhs]``.
    Returns ``(x, status)``, or ``(x, factor rows, status)`` ``with_factor``."""
    native = _native.engine(geometry.platform, fn, geometry.backend)
    route = _route(T_A, n, geometry, cyclic, relayout)
    conj = jnp.conj if geometry.form == "rows" else (lambda v: v)
    factor, x_rows, status = native.potrs(
        route.to_native(a),
        conj(b.T),
        geometry.position(),
        T_A=route.plan.tile,
        device_ids=geometry.device_ids,
        moves=route.native_moves,
        **geometry.native_job,
        **route.native_layout,
        **({"factor": with_factor} if route.blocks else {}),
    )
    if with_factor:
        return conj(x_rows.T), factor, status
    return conj(x_rows.T), status


def _potri_local(a, *, T_A, n, cyclic, relayout, geometry, fn):
    native = _native.engine(geometry.platform, fn, geometry.backend)
    route = _route(T_A, n, geometry, cyclic, relayout)
    inv_rows, status = native.potri(
        route.to_native(a),
        geometry.position(),
        T_A=route.plan.tile,
        device_ids=geometry.device_ids,
        moves=route.native_moves,
        **geometry.native_job,
        **route.native_layout,
    )
    if geometry.form == "grid":  # the lower triangle: the caller fills the upper one
        return route.from_native(inv_rows), status
    fill = functools.partial(_hermitian_from_triangle, axis_name=geometry.axis)
    inv = route.from_native(inv_rows, then=fill)
    return (_relayout(inv, T_A, geometry) if cyclic else inv), status


def _syevd_local(
    a, *, T_A, n, cyclic, relayout, vectors, geometry, fn, v_columns=False, spent=False
):
    """``v_columns``: return this device's column block ``V[:, blk]`` whatever the form of ``a``
    (jaxmg 0.0.x's ``syevd_shardmap_ctx``); else ``V``'s block in the form of ``a``. ``spent``
    (values only): also return the buffer the solver overwrote, in its native layout, so that
    a program with ``A`` donated has an output to give ``A``'s buffer to."""
    native = _native.engine(geometry.platform, fn, geometry.backend)
    route = _route(T_A, n, geometry, cyclic, relayout)
    v_rows, w, status = native.syevd(
        route.to_native(a),
        geometry.position(),
        T_A=route.plan.tile,
        device_ids=geometry.device_ids,
        vectors=vectors,
        moves=route.native_moves,
        **geometry.native_job,
        **route.native_layout,
    )
    if not vectors:
        return (w, v_rows, status) if spent else (w, status)
    if geometry.form == "grid":
        return w, route.from_native(v_rows), status
    if geometry.form == "cols":
        return w, (v_rows.T if cyclic else route.from_native(v_rows)), status
    # The solver saw conj(A): its eigenvector columns are conj(V), which read back by rows is
    # V^H, whose local conjugate transpose is the column block of V. The rows of V take one
    # conjugate transpose across devices.
    if v_columns:
        return w, jnp.conj(route.from_native(v_rows)).T, status
    v = _transpose_rows(route.from_native(v_rows), geometry.axis)
    return w, (_relayout(v, T_A, geometry) if cyclic else v), status


# --- placing arrays on a mesh -----------------------------------------------------------------


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
    if not _geometry.is_tracer(x) and isinstance(mesh, jax.sharding.Mesh):
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
