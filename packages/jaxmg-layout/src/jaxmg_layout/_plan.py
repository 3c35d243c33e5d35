"""Index math of the 1D block-cyclic column layout.

Naming (used throughout jaxmg):

- ``N``: global matrix size; ``ndev``: devices on the sharded mesh axis; ``s = N / ndev``: the
  shard size, the number of columns each device holds in JAX's block sharding.
- ``T_A``: the requested tile width; ``tile = min(T_A, s)``: the width actually used. A tile
  at least as wide as the shard needs no relayout: the block sharding already *is* the
  block-cyclic layout with tile width ``s``.
- global tile ``k`` (columns ``k*tile .. (k+1)*tile``) lives on device ``k % ndev`` in local
  slot ``k // ndev``; ``L = ceil(s / tile) * tile`` is every device's local width, zero
  columns after its last real tile.
- ``p = (-s) mod (ndev * tile)``: the padding added to each shard by the shift relayout.

Every tile size is valid. The relayout (:mod:`jaxmg_layout._relayout`) has two strategies:

- *shift* (the published one): one ``ppermute`` shifts columns between neighbours so that all
  padding ends at the global right edge, then reshapes and one ``all_to_all`` finish. The last
  shard must donate ``(ndev - 1) * p`` columns, so it applies only when
  ``(ndev - 1) * p <= s`` (:attr:`CyclicPlan.shift_relayout`).
- *gather*, for every other tile size: each device slices the column groups it owes other
  devices, one ``ppermute`` per device distance moves them between the pairs that share
  columns (no padding is sent), and local slices put them in order.
"""

from __future__ import annotations

import dataclasses
import math
import operator

import numpy as np

__all__ = [
    "CyclicPlan",
    "calculate_all_valid_T_A",
    "calculate_padding",
    "calculate_valid_T_A",
]


def _positive_int(value, name: str) -> int:
    """``value`` as an int if it is a positive integer (numpy integers too); else an error."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a positive int, got {value!r}.")
    try:
        as_int = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{name} must be a positive int, got {value!r} of type {type(value).__name__}."
        ) from None
    if as_int <= 0:
        raise ValueError(f"{name} must be a positive int, got {as_int}.")
    return as_int


def calculate_padding(shard_size: int, T_A: int, ndev: int) -> int:
    """Zero columns added to each shard so it splits into ``ndev`` groups of whole tiles.

    ``p = (-shard_size) mod (ndev * T_A)``. Example: N=100 on 4 devices (shard 25) with
    ``T_A=4`` gives ``p = 7``.
    """
    shard_size = _positive_int(shard_size, "shard_size")
    T_A = _positive_int(T_A, "T_A")
    ndev = _positive_int(ndev, "ndev")
    return (-shard_size) % (ndev * T_A)


def shift_applies(shard_size: int, T_A: int, ndev: int) -> bool:
    """Whether the one-ppermute shift relayout can produce tile ``T_A`` (or none is needed)."""
    if T_A >= shard_size:
        return True  # no relayout needed
    return (ndev - 1) * ((-shard_size) % (ndev * T_A)) <= shard_size


def calculate_all_valid_T_A(shard_size: int, ndev: int, T_A_max: int) -> list[int]:
    """Every valid tile size in ``[1, T_A_max)``, ascending.

    jaxmg relayouts every tile size (the shift relayout where it applies, the gather relayout
    elsewhere), so this is ``[1, ..., T_A_max - 1]``; it is kept for the original API.
    """
    shard_size = _positive_int(shard_size, "shard_size")
    ndev = _positive_int(ndev, "ndev")
    T_A_max = _positive_int(T_A_max, "T_A_max")
    return list(range(1, T_A_max))


def calculate_valid_T_A(
    shard_size: int, T_A: int, ndev: int, T_A_max: int
) -> tuple[int | None, int | None]:
    """The nearest valid tile sizes strictly below and above ``T_A`` in ``[1, T_A_max)``.

    ``None`` where there is none. Every tile size is valid (see
    :func:`calculate_all_valid_T_A`), so these are the neighbours of ``T_A`` within range.
    """
    T_A = _positive_int(T_A, "T_A")
    valid = calculate_all_valid_T_A(shard_size, ndev, T_A_max)
    smaller = max((t for t in valid if t < T_A), default=None)
    larger = min((t for t in valid if t > T_A), default=None)
    return smaller, larger


@dataclasses.dataclass(frozen=True)
class CyclicPlan:
    """The block-cyclic layout of one ``N x N`` matrix on ``ndev`` devices with tile ``T_A``.

    Build it with :meth:`make`, which validates the arguments. All index tables are numpy
    ``int64`` arrays, ready to hand to a native executor.

    Attributes:
        N, ndev, T_A: as requested.
        shard_size: ``N // ndev``, the columns per device in block sharding.
        tile: the tile width actually used, ``min(T_A, shard_size)``.
        padding: ``calculate_padding(shard_size, tile, ndev)``, the zero columns the shift
            relayout adds per shard (0 when no relayout is needed).
        local_width: ``L``, the columns per device in the block-cyclic layout.
        num_tiles: ``ceil(N / tile)``, the global tiles holding real columns.
        tile_owner, tile_slot: for global tile ``k``, its device ``k % ndev`` and local slot
            ``k // ndev``.
    """

    N: int
    ndev: int
    T_A: int
    shard_size: int
    tile: int
    padding: int
    local_width: int
    num_tiles: int

    @classmethod
    def make(cls, N: int, ndev: int, T_A: int) -> CyclicPlan:
        """Validate ``(N, ndev, T_A)`` and describe the layout.

        Raises:
            TypeError: a non-integer argument.
            ValueError: ``T_A <= 0``; ``N`` not divisible by ``ndev``.
        """
        N = _positive_int(N, "N")
        ndev = _positive_int(ndev, "ndev")
        T_A = _positive_int(T_A, "T_A")
        if N % ndev:
            raise ValueError(
                f"N={N} is not divisible by ndev={ndev}: the block sharding of JAX needs equal "
                "shards."
            )
        s = N // ndev
        tile = min(T_A, s)
        padding = calculate_padding(s, tile, ndev) if tile < s else 0
        local_width = math.ceil(s / tile) * tile
        return cls(
            N=N,
            ndev=ndev,
            T_A=T_A,
            shard_size=s,
            tile=tile,
            padding=padding,
            local_width=local_width,
            num_tiles=math.ceil(N / tile),
        )

    @property
    def needs_relayout(self) -> bool:
        """False when the tile is at least the shard size: block sharding is already cyclic."""
        return self.T_A < self.shard_size

    @property
    def shift_relayout(self) -> bool:
        """True when the one-ppermute shift relayout applies (else the gather relayout)."""
        return self.needs_relayout and shift_applies(self.shard_size, self.T_A, self.ndev)

    @property
    def tiles_per_device(self) -> int:
        """Local slots per device, ``local_width // tile`` (some may hold only padding)."""
        return self.local_width // self.tile

    @property
    def tile_owner(self) -> np.ndarray:
        return np.arange(self.num_tiles, dtype=np.int64) % self.ndev

    @property
    def tile_slot(self) -> np.ndarray:
        return np.arange(self.num_tiles, dtype=np.int64) // self.ndev

    def local_tiles(self, device: int) -> np.ndarray:
        """Global tile indices held by ``device``, in local slot order (real tiles only)."""
        return np.arange(device, self.num_tiles, self.ndev, dtype=np.int64)

    def global_to_local(self, column) -> tuple[np.ndarray, np.ndarray]:
        """``(device, local column)`` of global column(s) ``column`` in the cyclic layout."""
        column = np.asarray(column, dtype=np.int64)
        if np.any((column < 0) | (column >= self.N)):
            raise IndexError(f"global column out of range [0, {self.N})")
        k, offset = np.divmod(column, self.tile)
        return k % self.ndev, (k // self.ndev) * self.tile + offset

    def local_to_global(self, device, local_column) -> np.ndarray:
        """Global column at ``(device, local column)``; ``-1`` where it is padding."""
        device = np.asarray(device, dtype=np.int64)
        local_column = np.asarray(local_column, dtype=np.int64)
        if np.any((local_column < 0) | (local_column >= self.local_width)):
            raise IndexError(f"local column out of range [0, {self.local_width})")
        slot, offset = np.divmod(local_column, self.tile)
        column = (device + slot * self.ndev) * self.tile + offset
        return np.where(column < self.N, column, -1)

    def column_map(self) -> np.ndarray:
        """``[ndev, local_width]`` table of the global column at each local column (-1: pad)."""
        devices = np.arange(self.ndev, dtype=np.int64)[:, None]
        local = np.arange(self.local_width, dtype=np.int64)[None, :]
        return self.local_to_global(devices, local)
