"""The argument checks every public function runs first, in Python, before any device work: each
returns the accepted value or raises naming the caller and what would be accepted. Also the tile
rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeAlias

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import jaxmg_layout

SUPPORTED_DTYPES = tuple(
    np.dtype(name) for name in ("float32", "float64", "complex64", "complex128")
)
_DTYPE_NAMES = ", ".join(d.name for d in SUPPORTED_DTYPES)

RELAYOUTS = ("native", "jax")

# The types of the public functions' arguments and results.
AnyMesh: TypeAlias = jax.sharding.Mesh | jax.sharding.AbstractMesh
#: ``in_specs`` / ``matrix_specs``: ``A``'s spec, or one per array argument.
Specs: TypeAlias = P | Sequence[P | None]
Relayout: TypeAlias = Literal["native", "jax"]
Backend: TypeAlias = Literal["mg", "mp", "jax"] | None
#: What a routine returns: one array, or a tuple of them (and its status) as its flags say.
Result: TypeAlias = jax.Array | tuple[jax.Array, ...]


def relayout(value, caller: str) -> str:
    """The relayout strategy, or a ValueError naming the accepted ones."""
    if not isinstance(value, str) or value not in RELAYOUTS:
        raise ValueError(
            f"{caller}: relayout must be 'native' (in place, inside the solver call) or 'jax' "
            f"(JAX collectives), got {value!r}."
        )
    return value


def matrix_dtype(a, caller: str, argname: str = "A") -> np.dtype:
    """The dtype of a 2-D matrix argument, or a TypeError/ValueError saying what is accepted."""
    shape = getattr(a, "shape", None)
    dtype = getattr(a, "dtype", None)
    if shape is None or dtype is None:
        raise TypeError(f"{caller}: {argname} must be a jax.Array, got {type(a).__name__}.")
    if len(shape) != 2:
        raise ValueError(f"{caller}: {argname} must be 2-D [N, N], got shape {tuple(shape)}.")
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{caller}: {argname} has dtype {dtype.name}; accepted: {_DTYPE_NAMES}.")
    return dtype


def square_size(a, caller: str, argname: str = "A") -> int:
    n_rows, n_cols = a.shape
    if n_rows != n_cols:
        raise ValueError(f"{caller}: {argname} must be square [N, N], got shape {tuple(a.shape)}.")
    return int(n_rows)


def rhs_shape(b, n: int, dtype: np.dtype, caller: str) -> tuple[int, ...]:
    """Check ``b`` is ``[N]`` or ``[N, nrhs]`` with A's dtype; return its shape."""
    shape = getattr(b, "shape", None)
    if shape is None or getattr(b, "dtype", None) is None:
        raise TypeError(f"{caller}: b must be a jax.Array, got {type(b).__name__}.")
    if len(shape) not in (1, 2) or shape[0] != n or (len(shape) == 2 and shape[1] < 1):
        raise ValueError(
            f"{caller}: b must have shape [{n}] or [{n}, nrhs] with nrhs >= 1 to match the {n} "
            f"rows of A, got {tuple(shape)}."
        )
    if np.dtype(b.dtype) != dtype:
        raise TypeError(
            f"{caller}: b has dtype {np.dtype(b.dtype).name} but A has {dtype.name}; they must be "
            "equal (cast one of them)."
        )
    return tuple(shape)


def tile_size(T_A, caller: str, cyclic_1d: bool = False) -> int | None:
    """``T_A`` as an int, or ``None`` (the engine chooses it later); a block-cyclic
    input needs the ``T_A`` it was laid out with."""
    if T_A is None:
        if cyclic_1d:
            raise ValueError(
                f"{caller}: with cyclic_1d=True pass the T_A that A was laid out with "
                "(jaxmg.cyclic_1d_layout(A, T_A)); T_A=None is for block-sharded A."
            )
        return None
    if isinstance(T_A, bool) or not isinstance(T_A, (int, np.integer)):
        raise TypeError(f"{caller}: T_A must be a positive int or None (automatic), got {T_A!r}.")
    if T_A <= 0:
        raise ValueError(f"{caller}: T_A must be a positive int or None (automatic), got {T_A}.")
    return int(T_A)


def mp_tile(block: tuple[int, ...], pad) -> int:
    """The tile ``T_A=None`` stands for on backend ``"mp"``, for blocks of ``block`` rows and
    columns: the narrower extent of a block, so that a 1D or square grid needs no relayout and
    no second copy of a block (a narrower tile spreads ScaLAPACK's work better over many
    processes, at the price of a relayout: docs/performance.md measures both);
    with ``pad=False`` the widest tile up to that which divides every block extent."""
    tile = min(block)
    if pad is False:
        tile = max(t for t in range(1, tile + 1) if all(b % t == 0 for b in block))
    return tile


def unpadded(pad, layout: jaxmg_layout.CyclicPlan, caller: str) -> None:
    """``pad=False`` (jaxmg 0.0.x): the caller promises jaxmg need not widen A's blocks to
    whole tiles. Refuses a tile that would need it, naming tiles that would not."""
    if not isinstance(pad, (bool, np.bool_)):
        raise TypeError(f"{caller}: pad must be True or False, got {pad!r}.")
    s = layout.shard_size
    if pad or not layout.needs_relayout or s % layout.tile == 0:
        return
    divisors = ", ".join(str(t) for t in [t for t in range(2, s) if s % t == 0][-5:])
    raise ValueError(
        f"{caller}: pad=False, but T_A={layout.T_A} does not divide the {s} rows/columns each "
        "device holds, so A's blocks would be widened to whole tiles. Use pad=True (the "
        f"default), a T_A of at least {s} (no relayout)"
        + (f", or one that divides {s} ({divisors})." if divisors else ".")
    )


def in_specs(value, caller: str, arrays: tuple[str, ...]) -> tuple:
    """``in_specs`` as one entry per array argument (``None`` where not given).

    Accepted: ``None``, a ``PartitionSpec`` (for ``A``), or a tuple/list of one
    ``PartitionSpec`` per array argument (``b``'s may be left out or ``None``).
    """
    if value is None:
        return (None,) * len(arrays)
    specs = (value,) if isinstance(value, P) else value
    if not isinstance(specs, (tuple, list)) or not 1 <= len(specs) <= len(arrays):
        raise TypeError(
            f"{caller}: in_specs must be a PartitionSpec or a tuple of up to {len(arrays)} of them "
            f"(one per argument {', '.join(arrays)}), got {value!r} of type "
            f"{type(value).__name__}."
        )
    for name, spec in zip(arrays, specs, strict=False):
        if not isinstance(spec, P) and not (spec is None and name != arrays[0]):
            raise TypeError(
                f"{caller}: in_specs entry for {name} must be a jax.sharding.PartitionSpec, got "
                f"{spec!r} of type {type(spec).__name__}."
            )
    return tuple(specs) + (None,) * (len(arrays) - len(specs))


def matrix_specs(in_specs, matrix_specs, caller: str):
    """``(specs, v1)``: jaxmg 1.x's ``matrix_specs=`` is ``in_specs`` under its 1.x name (the
    same positional slot, the spec of ``A``); ``v1`` says the call used it, and so is 1.x's
    (its status then comes in 1.x's form, :mod:`jaxmg.describe.v1_status`)."""
    if matrix_specs is None:
        return in_specs, False
    if in_specs is not None:
        raise ValueError(
            f"{caller}: pass the sharding of A once, as in_specs= (or positionally) or as "
            "matrix_specs= (jaxmg 1.x's name), not both."
        )
    return matrix_specs, True


def flag(value, name: str, caller: str) -> bool:
    """A boolean option, checked: ``True`` or ``False`` (numpy's bools too)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{caller}: {name} must be True or False, got {value!r}.")
    return bool(value)


#: The function on local blocks, inside a user's ``shard_map``, of each function on global arrays.
_ON_LOCAL_BLOCKS = {
    "potrs": "potrs_no_shardmap",
    "potri": "potri_no_shardmap",
    "syevd": "syevd_no_shardmap",
    "cho_factor": "potrs_no_shardmap",
    "cho_solve": "potrs_no_shardmap",
}


def global_arrays(caller: str) -> None:
    """Refuse a call of a function on global arrays from inside a ``jax.shard_map`` (at trace
    time: the abstract mesh has manual axes there), where its arrays are local blocks and its
    own programs would run a ``shard_map`` inside the caller's; say which ``*_no_shardmap``
    function takes the blocks."""
    mesh = jax.sharding.get_abstract_mesh()
    manual = () if mesh.empty else tuple(mesh.manual_axes)
    if not manual:
        return
    name = caller.removeprefix("jaxmg.").removesuffix("_shardmap_ctx")
    local = _ON_LOCAL_BLOCKS.get(name)
    instead = (
        f"call jaxmg.{local} there, which takes this device's block of A"
        if local
        else "call it outside the shard_map on the global arrays (inside one, jaxmg takes local "
        "blocks in potrs_no_shardmap, potri_no_shardmap and syevd_no_shardmap)"
    )
    raise ValueError(
        f"{caller} takes global arrays, but it is called inside jax.shard_map (manual axes "
        f"{manual}), where arrays are each device's local blocks: {instead}."
    )


def keyword_only(caller: str, extra: tuple, was: str) -> None:
    """Positional arguments past ``in_specs`` are refused: older jaxmg releases put other
    arguments there, so taking them would silently change a call's meaning."""
    if extra:
        raise TypeError(
            f"{caller}: the arguments after in_specs are keyword-only, got {len(extra)} more "
            f"positional argument(s) {extra!r}. In earlier jaxmg releases the next positional "
            f"argument was {was}: pass it by name."
        )


def arguments(caller: str, positional: tuple, was: str, specs, v1_specs, arrays: tuple[str, ...]):
    """The first checks of a public function on global arrays: no positional argument past
    ``in_specs`` (``was``: what older releases put there), ``A``'s sharding given once (as
    ``in_specs`` or as 1.x's ``matrix_specs``, ``v1_specs``), one spec per array named in
    ``arrays``. Returns ``(specs, v1)``: a spec or ``None`` per array, and whether the call
    named ``matrix_specs`` (so is 1.x's)."""
    global_arrays(caller)
    keyword_only(caller, positional, was)
    given, v1 = matrix_specs(specs, v1_specs, caller)
    return in_specs(given, caller, arrays), v1


def square_matrix(a, T_A, cyclic_1d, relayout_name, pad, caller: str):
    """The checks of a square ``A`` and its options that need no mesh. Returns ``(T_A, dtype,
    relayout, N)``; ``N`` is ``None`` for ``A`` in the block-cyclic layout (``cyclic_1d``),
    whose shape says ``N`` only with the device count."""
    global_arrays(caller)
    T_A = tile_size(T_A, caller, cyclic_1d)
    shape = getattr(a, "shape", ())
    if not cyclic_1d and pad is False and len(shape) == 2 and shape[0] != shape[1]:
        raise ValueError(
            f"{caller}: A must be square [N, N], got shape {tuple(shape)}. jaxmg takes A "
            "unpadded: jaxmg 0.0.x's pre-padded shards (pad=False) are not accepted; pass the "
            "N x N matrix."
        )
    dtype = matrix_dtype(a, caller)
    n = None if cyclic_1d else square_size(a, caller)
    return T_A, dtype, relayout(relayout_name, caller), n


def plan(n: int, ndev: int, T_A: int, caller: str) -> jaxmg_layout.CyclicPlan:
    """The block-cyclic plan, with the layout's error messages prefixed by the call."""
    if n % ndev:
        raise ValueError(
            f"{caller}: N={n} is not divisible by the {ndev} devices of the sharded axis; jaxmg "
            "needs equal shards (pad A, or use a device count that divides N)."
        )
    try:
        return jaxmg_layout.CyclicPlan.make(n, ndev, T_A)
    except (ValueError, TypeError) as err:
        raise type(err)(f"{caller}: {err}") from None


def grid_plan(n: int, grid: tuple[int, int], T_A, pad, caller: str) -> jaxmg_layout.BlockCyclic2D:
    """The 2D block-cyclic layout of an ``N x N`` matrix sharded ``P(r, c)``: ``T_A=None``
    takes :func:`mp_tile`.
    Raises for an ``N`` the grid does not divide, and for ``pad=False`` with a tile that would
    widen A's blocks."""
    rows, cols = grid
    if n % rows or n % cols:
        raise ValueError(
            f"{caller}: N={n} is not divisible by the {rows} x {cols} process grid of P(r, c); "
            "jaxmg needs equal blocks (pad A, or use a grid whose extents divide N)."
        )
    if not isinstance(pad, (bool, np.bool_)):
        raise TypeError(f"{caller}: pad must be True or False, got {pad!r}.")
    if T_A is None:
        T_A = mp_tile((n // rows, n // cols), pad)
    layout = jaxmg_layout.BlockCyclic2D.for_blocks(n, grid, T_A)
    if not pad and layout.padded_local_shape != layout.shard_shape:
        raise ValueError(
            f"{caller}: pad=False, but T_A={T_A} does not divide A's {layout.shard_shape[0]} x "
            f"{layout.shard_shape[1]} blocks, which would be widened to whole tiles. Use "
            "pad=True (the default) or a T_A dividing both."
        )
    return layout


def cyclic_shape(a, geometry, T_A: int, caller: str) -> int:
    """For ``cyclic_1d=True``: check A has the block-cyclic global shape; return N."""
    n = int(a.shape[1 - geometry.sharded_dim])
    layout = plan(n, geometry.ndev, T_A, caller)
    expected = [n, n]
    expected[geometry.sharded_dim] = geometry.ndev * layout.local_width
    if tuple(a.shape) != tuple(expected):
        raise ValueError(
            f"{caller}: with cyclic_1d=True, A must already be in the block-cyclic layout of "
            f"jaxmg.cyclic_1d_layout(A, T_A={T_A}), of shape {tuple(expected)}; got "
            f"{tuple(a.shape)}."
        )
    return n
