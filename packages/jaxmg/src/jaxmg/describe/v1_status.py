"""jaxmg 1.x's status: a vector of int32 words per process, built from jaxmg's own status.

jaxmg 1.x (cuSOLVERMp) returns, from each of the ``P`` processes of its grid, a fixed number of
diagnostic words (its ``_cusolvermp_status.py`` names them), stacked into one ``[P * words]``
vector. A 1.x program reads two of them: word 0, the status code (0: success), and the
routine's LAPACK ``info``. Where a call is unambiguously 1.x's (the names only 1.x has, the
``*_shardmap_ctx`` functions on global arrays, ``matrix_specs=``), jaxmg returns this vector
with those words meaning what they mean in 1.x, and the grid, the sizes and the tile filled in;
the words about cuSOLVERMp's own handles, workspaces and redistributions are 0, since jaxmg's
engines keep those to themselves. Every process's block is the same (jaxmg's status is the
whole call's), and the vector is replicated.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from .call import Geometry


@dataclasses.dataclass(frozen=True)
class _Words:
    """Where a routine's words are: its vector's length, the status code 1.x writes when the
    routine's ``info`` is nonzero, and the indices of the sizes and of each (called, info)
    pair, in 1.x's order."""

    size: int
    failed: int
    m: int | None
    n: int
    tile: int
    stages: tuple[tuple[int, int], ...]
    nrhs: int | None = None


#: The status codes are 1.x's ``kPotrfInfoNonzero`` (27), ``kSyevdInfoNonzero`` (35),
#: ``kGetrfInfoNonzero`` (39) and ``kGesvdInfoNonzero`` (46), from its C++ sources; for qr,
#: polar and least_squares the sources that were available name the code, not its value:
#: jaxmg writes 100 there (nonzero, as 1.x's).
_WORDS = {
    "potrs": _Words(40, 27, None, 13, 14, ((26, 27), (28, 29)), nrhs=36),
    "syevd": _Words(36, 35, None, 13, 14, ((23, 24),)),
    "lu_solve": _Words(41, 39, None, 13, 14, ((26, 27), (28, 29)), nrhs=36),
    "gesvd": _Words(42, 46, 13, 14, 15, ((33, 34),)),
    "polar": _Words(32, 100, 13, 14, 15, ((26, 27),)),
    "least_squares": _Words(35, 100, 13, 14, 15, ((26, 27),), nrhs=32),
    "qr": _Words(36, 100, 14, 15, 16, ((28, 29), (31, 32))),
}
_ROWS, _COLS = 4, 5


def vector(routine: str, info, geometry: Geometry, *, shape, tile, nrhs=None):
    """The 1.x status vector of ``routine`` whose ``info`` (jaxmg's status, an int32 scalar,
    possibly traced) is given: ``[P * words]`` int32."""
    words = _WORDS[routine]
    rows, cols = geometry.blocks_grid
    m, n = shape
    fixed = np.zeros(words.size, np.int32)
    fixed[_ROWS], fixed[_COLS] = rows, cols
    fixed[words.n], fixed[words.tile] = n, tile
    if words.m is not None:
        fixed[words.m] = m
    if words.nrhs is not None and nrhs is not None:
        fixed[words.nrhs] = nrhs
    first_called, first_info = words.stages[0]
    fixed[first_called] = 1
    info = jnp.asarray(info, jnp.int32)
    block = jnp.asarray(fixed).at[0].set(jnp.where(info != 0, words.failed, 0))
    block = block.at[first_info].set(info)
    for called, _ in words.stages[1:]:  # the later stages run when the first succeeded
        block = block.at[called].set((info == 0).astype(jnp.int32))
    return jnp.tile(block, rows * cols)
