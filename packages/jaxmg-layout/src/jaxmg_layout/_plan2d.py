"""Index math of the 2D block-cyclic layout (ScaLAPACK's, cuSOLVERMp's).

Naming (ScaLAPACK's, with jaxmg's ``tile``):

- an ``M x N`` matrix on a ``rows x cols`` process grid (``P(r, c)``: process row ``pr`` of
  ``rows``, process column ``pc`` of ``cols``), in square ``tile x tile`` blocks;
- global block row ``I = i // tile`` lives on process row ``I % rows`` at local block row
  ``I // rows``; block columns likewise over ``cols``. The first block row and column are on
  process ``(0, 0)`` (ScaLAPACK's ``RSRC = CSRC = 0``);
- each process keeps its blocks as one column-major local array of
  ``numroc(M, tile, pr, rows) x numroc(N, tile, pc, cols)`` elements; its leading dimension
  (``LLD``) is at least its local row count.

The 1D column layout of cuSolverMg (:class:`jaxmg_layout.CyclicPlan`) is the ``1 x ndev`` grid
of this one (with ``tile`` columns and all rows in one block row); the 1D row layout is
``ndev x 1``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._plan import _positive_int

__all__ = ["BlockCyclic2D", "numroc"]


def numroc(n: int, tile: int, process: int, processes: int) -> int:
    """Rows (or columns) of an ``n``-long dimension that ``process`` of ``processes`` holds in
    ``tile``-wide blocks, the first on process 0: ScaLAPACK's ``NUMROC``."""
    blocks, rest = divmod(n, tile)
    mine = (blocks // processes) * tile
    extra = blocks % processes
    if process < extra:
        mine += tile
    elif process == extra:
        mine += rest
    return mine


@dataclasses.dataclass(frozen=True)
class BlockCyclic2D:
    """The 2D block-cyclic layout of one ``M x N`` matrix on a ``rows x cols`` process grid.

    Build it with :meth:`make`, which validates the arguments. Index tables are numpy ``int64``.

    Attributes:
        M, N: the global shape.
        rows, cols: the process grid (``P(r, c)`` with ``rows * cols`` processes).
        tile: the square block size (ScaLAPACK's ``MB = NB``).
    """

    M: int
    N: int
    rows: int
    cols: int
    tile: int

    @classmethod
    def make(cls, M: int, N: int, grid: tuple[int, int], tile: int) -> BlockCyclic2D:
        """Validate ``(M, N, grid, tile)`` and describe the layout.

        Raises:
            TypeError: a non-integer argument, or a grid that is not a pair.
            ValueError: a non-positive size, grid extent or tile.
        """
        if not isinstance(grid, (tuple, list)) or len(grid) != 2:
            raise TypeError(f"grid must be a (rows, cols) pair of process counts, got {grid!r}.")
        return cls(
            M=_positive_int(M, "M"),
            N=_positive_int(N, "N"),
            rows=_positive_int(grid[0], "grid rows"),
            cols=_positive_int(grid[1], "grid cols"),
            tile=_positive_int(tile, "tile"),
        )

    @classmethod
    def for_blocks(cls, N: int, grid: tuple[int, int], T_A: int) -> BlockCyclic2D:
        """The layout jaxmg relayouts an ``N x N`` matrix sharded ``P(r, c)`` into: square tiles
        of ``min(T_A, N / rows, N / cols)``, as wide as asked but never wider than a shard.

        Raises:
            ValueError: ``N`` not divisible by both grid extents (JAX's block sharding needs
                equal shards), or a non-positive argument.
        """
        plan = cls.make(N, N, grid, T_A)
        if N % plan.rows or N % plan.cols:
            raise ValueError(
                f"N={N} is not divisible by the {plan.rows} x {plan.cols} grid: JAX's block "
                "sharding P(r, c) needs equal shards, so N must be a multiple of both extents."
            )
        return dataclasses.replace(plan, tile=min(plan.tile, N // plan.rows, N // plan.cols))

    @property
    def processes(self) -> int:
        return self.rows * self.cols

    @property
    def shard_shape(self) -> tuple[int, int]:
        """A process's block in JAX's block sharding ``P(r, c)``: ``(M / rows, N / cols)``."""
        return self.M // self.rows, self.N // self.cols

    @property
    def padded_local_shape(self) -> tuple[int, int]:
        """The local array every process holds after jaxmg's relayout: the shard's extents
        rounded up to whole tiles. At least :meth:`local_shape` on every process (the extra
        rows and columns are zeros past the last real tile, which the engines never read:
        rows below ``LLD``'s use, columns past the local count)."""
        rows, cols = self.shard_shape
        return -(-rows // self.tile) * self.tile, -(-cols // self.tile) * self.tile

    def local_shape(self, pr: int, pc: int) -> tuple[int, int]:
        """The local array of process ``(pr, pc)``: ``(local rows, local columns)``."""
        self._check_process(pr, pc)
        return (
            numroc(self.M, self.tile, pr, self.rows),
            numroc(self.N, self.tile, pc, self.cols),
        )

    def leading_dimension(self, pr: int) -> int:
        """The smallest valid ``LLD`` of process row ``pr``'s local arrays (at least 1)."""
        return max(1, numroc(self.M, self.tile, pr, self.rows))

    def row_map(self, pr: int) -> np.ndarray:
        """The global rows process row ``pr`` holds, in local order."""
        return self._map(self.M, pr, self.rows)

    def col_map(self, pc: int) -> np.ndarray:
        """The global columns process column ``pc`` holds, in local order."""
        return self._map(self.N, pc, self.cols)

    def global_to_local(self, i, j):
        """``(pr, pc, local row, local column)`` of global element(s) ``(i, j)``."""
        i, j = np.asarray(i, dtype=np.int64), np.asarray(j, dtype=np.int64)
        if np.any((i < 0) | (i >= self.M) | (j < 0) | (j >= self.N)):
            raise IndexError(f"global index out of range [0, {self.M}) x [0, {self.N})")
        bi, oi = np.divmod(i, self.tile)
        bj, oj = np.divmod(j, self.tile)
        return (
            bi % self.rows,
            bj % self.cols,
            (bi // self.rows) * self.tile + oi,
            (bj // self.cols) * self.tile + oj,
        )

    def local_to_global(self, pr, pc, li, lj):
        """Global ``(row, column)`` of local element(s) ``(li, lj)`` of process ``(pr, pc)``."""
        pr, pc = np.asarray(pr, dtype=np.int64), np.asarray(pc, dtype=np.int64)
        li, lj = np.asarray(li, dtype=np.int64), np.asarray(lj, dtype=np.int64)
        if np.any((li < 0) | (lj < 0)):
            raise IndexError("local index out of range")
        bi, oi = np.divmod(li, self.tile)
        bj, oj = np.divmod(lj, self.tile)
        i = (bi * self.rows + pr) * self.tile + oi
        j = (bj * self.cols + pc) * self.tile + oj
        if np.any((i >= self.M) | (j >= self.N)):
            raise IndexError("local index beyond the process's local array")
        return i, j

    def local_block(self, a: np.ndarray, pr: int, pc: int) -> np.ndarray:
        """Process ``(pr, pc)``'s local array of the global ``a`` (numpy, Fortran order)."""
        if a.shape != (self.M, self.N):
            raise ValueError(f"a has shape {a.shape}, the layout is of {self.M} x {self.N}")
        self._check_process(pr, pc)
        return np.asfortranarray(a[np.ix_(self.row_map(pr), self.col_map(pc))])

    def padded_local_block(self, a: np.ndarray, pr: int, pc: int) -> np.ndarray:
        """:meth:`local_block` with zeros up to :attr:`padded_local_shape` (row-major numpy)."""
        block = self.local_block(a, pr, pc)
        out = np.zeros(self.padded_local_shape, a.dtype)
        out[: block.shape[0], : block.shape[1]] = block
        return out

    def assemble(self, blocks) -> np.ndarray:
        """The global matrix from every process's local array (``blocks[pr][pc]``)."""
        first = np.asarray(blocks[0][0])
        out = np.empty((self.M, self.N), first.dtype)
        for pr in range(self.rows):
            for pc in range(self.cols):
                local = np.asarray(blocks[pr][pc])
                if local.shape != self.local_shape(pr, pc):
                    raise ValueError(
                        f"process ({pr}, {pc}) holds {local.shape}, expected "
                        f"{self.local_shape(pr, pc)}"
                    )
                out[np.ix_(self.row_map(pr), self.col_map(pc))] = local
        return out

    def _map(self, n: int, process: int, processes: int) -> np.ndarray:
        blocks = np.arange(process, -(-n // self.tile), processes, dtype=np.int64)
        index = (blocks[:, None] * self.tile + np.arange(self.tile, dtype=np.int64)).reshape(-1)
        return index[index < n]

    def _check_process(self, pr: int, pc: int) -> None:
        if not (0 <= pr < self.rows and 0 <= pc < self.cols):
            raise IndexError(f"process ({pr}, {pc}) is not on the {self.rows} x {self.cols} grid")
