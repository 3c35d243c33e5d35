"""jaxmg 0.0.x's names for the functions inside ``shard_map`` (``*_shardmap_ctx``, blocks of
rows), which are also jaxmg 1.x's names for functions on global arrays: each tells the two apart
by where it is called (:func:`jaxmg.solvers.in_shard_map.in_shard_map`).
"""

from __future__ import annotations

from typing import Any

import jax

from ..describe.checks import Backend, Relayout, Result
from ..solvers.in_shard_map import (
    _local_statics,
    _potri_blocks,
    _potrs_blocks,
    _syevd_blocks,
    in_shard_map,
)
from . import v1


def potrs_shardmap_ctx(
    a: jax.Array,
    b: jax.Array,
    T_A: int | None = None,
    *args: Any,
    **kwargs: Any,
) -> Result:
    """Two functions of one name, told apart by where they are called:

    - inside a ``jax.shard_map`` (jaxmg 0.0.x): ``potrs_shardmap_ctx(a, b, T_A=None, pad=True,
      *, axis_name=None, relayout="native", backend=None)``, :func:`potrs_no_shardmap` on
      ``a``, this device's block of rows ``[N/ndev, N]`` (``P(ax, None)``); returns ``(x,
      status)``. ``axis_name`` (not in 0.0.x): default the one axis of the enclosing
      ``shard_map`` whose size fits the block.
    - on global arrays (jaxmg 1.x, as NetKet 3.23 calls it): ``potrs_shardmap_ctx(a, b,
      T_A=None, mesh=None, matrix_specs=None, *, in_specs=None, return_logdet=False, pad=True,
      backend=None)``, :func:`jaxmg.potrs` keeping ``a`` and ``b``; returns ``(a_work, x,
      status)`` or ``(a_work, x, logdet, status)``, ``a_work`` being ``a`` and the status
      1.x's vector (docs/migration.md, ``return_status``).

    Neither form runs where the other belongs, so no call that works changes meaning.
    """
    if not in_shard_map():
        return v1.potrs_global(a, b, T_A, *args, **kwargs)
    return _potrs_rows(a, b, T_A, *args, **kwargs)


def _potrs_rows(a, b, T_A=None, pad=True, *, axis_name=None, relayout="native", backend=None):
    caller = "jaxmg.potrs_shardmap_ctx"
    call = _local_statics(a, T_A, False, axis_name, "rows", relayout, pad, "potrs", caller, backend)
    return _potrs_blocks(a, b, call)


def potri_shardmap_ctx(
    a: jax.Array,
    T_A: int | None = None,
    pad: bool = True,
    *,
    axis_name: str | tuple[str, str] | None = None,
    relayout: Relayout = "native",
    backend: Backend = None,
) -> Result:
    """jaxmg 0.0.x's :func:`potri_no_shardmap` on a block of rows ``[N/ndev, N]``: returns
    ``(inverse_rows, status)``, this device's rows of the full Hermitian inverse (0.0.x
    returned only the upper triangle, for :func:`potri_symmetrize`, which leaves this
    unchanged)."""
    caller = "jaxmg.potri_shardmap_ctx"
    call = _local_statics(a, T_A, False, axis_name, "rows", relayout, pad, "potri", caller, backend)
    return _potri_blocks(call, a)


def syevd_shardmap_ctx(
    a: jax.Array,
    T_A: int | None = None,
    *args: Any,
    **kwargs: Any,
) -> Result:
    """Two functions of one name, told apart by where they are called:

    - inside a ``jax.shard_map`` (jaxmg 0.0.x): ``syevd_shardmap_ctx(a, T_A=None,
      return_eigenvectors=True, pad=True, *, axis_name=None, relayout="native",
      backend=None)``, :func:`syevd_no_shardmap` on a block of rows ``[N/ndev, N]``; returns
      ``(w, v_columns, status)``, or ``(w, status)`` without eigenvectors. As in 0.0.x,
      ``v_columns`` is this device's block of columns of ``V``, ``[N, N/ndev]`` (``V[:, blk]``,
      for ``out_specs=P(None, ax)``), which here costs no communication.
    - on global arrays (jaxmg 1.x, as NetKet 3.23 calls it): ``syevd_shardmap_ctx(a, T_A=None,
      mesh=None, matrix_specs=None, *, in_specs=None, return_eigenvectors=True, pad=True,
      backend=None)``, :func:`jaxmg.syevd` keeping ``a``; returns ``(a_work, w, V, status)``
      or ``(a_work, w, status)``, ``a_work`` being ``a`` and the status 1.x's vector.
    """
    if not in_shard_map():
        return v1.syevd_global(a, T_A, *args, **kwargs)
    return _syevd_rows(a, T_A, *args, **kwargs)


def _syevd_rows(
    a,
    T_A=None,
    return_eigenvectors=True,
    pad=True,
    *,
    axis_name=None,
    relayout="native",
    backend=None,
):
    caller = "jaxmg.syevd_shardmap_ctx"
    call = _local_statics(a, T_A, False, axis_name, "rows", relayout, pad, "syevd", caller, backend)
    return _syevd_blocks(call, a, bool(return_eigenvectors), v_columns=True)
