"""jaxmg 0.0.x's layout helpers, as thin entry points over today's layout API.

``cyclic_1d`` (0.0.7) relayouts a sharded matrix, ``verify_cyclic`` (0.0.7) checks such a
relayout, ``manual_cyclic_1d_layout`` (0.0.1) builds the layout of an unsharded matrix and
``plot_block_to_cyclic`` (both) draws it. Each keeps its 0.0.x name, argument order and result;
where today's layout differs from 0.0.x's, the docstring says how. The layout itself is
:mod:`jaxmg_layout`'s: global tile ``k`` (``T_A`` rows or columns) on device ``k % ndev`` in
local slot ``k // ndev``, every device's block ``L = ceil((N/ndev)/T_A)*T_A`` wide, zeros after
its last real tile; a tile at least ``N/ndev`` wide leaves the matrix as it is.
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpy.typing
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxmg_layout

from ..describe import checks

__all__ = ["cyclic_1d", "manual_cyclic_1d_layout", "plot_block_to_cyclic", "verify_cyclic"]


def _one_spec(in_specs, caller: str) -> P:
    """0.0.x's ``in_specs`` for one matrix: a ``PartitionSpec`` or a 1-element list/tuple."""
    if isinstance(in_specs, (list, tuple)):
        if len(in_specs) != 1:
            raise ValueError(
                f"{caller}: in_specs must be a single PartitionSpec or a 1-element list/tuple, got "
                f"{len(in_specs)} entries."
            )
        in_specs = in_specs[0]
    if not isinstance(in_specs, P):
        raise TypeError(
            f"{caller}: in_specs must be a PartitionSpec or a 1-element list/tuple containing one, "
            f"got {in_specs!r}."
        )
    return in_specs


def _sharded_axis(sharding: NamedSharding, caller: str) -> tuple[int, int]:
    """(array axis, device count) of a matrix sharded over one mesh axis, by rows or columns."""
    spec = tuple(sharding.spec) + (None,) * (2 - len(sharding.spec))
    sharded = [(i, entry) for i, entry in enumerate(spec) if entry is not None]
    if len(spec) != 2 or len(sharded) != 1 or not isinstance(sharded[0][1], str):
        raise ValueError(
            f"{caller}: the matrix must be sharded over one mesh axis, by rows P(ax, None) or by "
            f"columns P(None, ax); got {sharding.spec}."
        )
    return sharded[0][0], sharding.mesh.shape[sharded[0][1]]


def cyclic_1d(
    a: jax.Array,
    T_A: int,
    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = None,
    in_specs: P | list[P] | tuple[P, ...] | None = None,
    pad: bool = True,
) -> jax.Array:
    """jaxmg 0.0.7's ``cyclic_1d``: ``a`` in the 1D block-cyclic layout (``cyclic_1d_layout``).

    Args:
        a: square ``N x N`` matrix, sharded over one mesh axis by rows ``P(ax, None)`` (0.0.x's
            only form) or by columns ``P(None, ax)``; eager or traced under ``jax.jit``.
        T_A: tile width (rows or columns per tile).
        mesh, in_specs: the mesh and the ``PartitionSpec`` of ``a`` (or a 1-element
            list/tuple of it); ``None`` (both) reads them from ``a.sharding``.
        pad: ``True`` (default) accepts every ``T_A``. ``False`` refuses, with a
            ``ValueError``, a ``T_A < N/ndev`` that does not divide ``N/ndev`` (0.0.x then
            asked for a matrix the caller had padded itself, which is not accepted).

    Returns:
        The relayouted matrix with ``a``'s sharding, as 0.0.x's code returned it: for row
        sharding ``ndev*L x N`` (``N x ndev*L`` for columns), device ``d`` holding global tiles
        ``d, d + ndev, ...`` in order, then zero rows. Unlike 0.0.x, ``a`` is not donated.
        ``T_A >= N/ndev`` returns ``a`` itself.

    Raises:
        TypeError: ``in_specs`` not a ``PartitionSpec`` or a 1-element container of one;
            ``T_A`` or ``pad`` of the wrong type.
        ValueError: a container of another length, a sharding over other than one mesh axis,
            a non-square ``a``, ``N`` not divisible by the devices, ``T_A <= 0``, ``pad=False``
            with a tile that does not divide ``N/ndev``.
    """
    caller = "jaxmg.cyclic_1d"
    if mesh is not None or in_specs is not None:
        if mesh is None or in_specs is None:
            raise ValueError(f"{caller}: pass both mesh and in_specs, or neither (read from a).")
        sharding = NamedSharding(mesh, _one_spec(in_specs, caller))
    else:
        sharding = getattr(a, "sharding", None)
        if not isinstance(sharding, NamedSharding):
            raise ValueError(
                f"{caller}: a carries no NamedSharding; pass mesh and in_specs (0.0.x's arguments)."
            )
    _, ndev = _sharded_axis(sharding, caller)
    if getattr(a, "ndim", None) != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"{caller}: a must be a square matrix, got shape {np.shape(a)}.")
    checks.unpadded(pad, jaxmg_layout.CyclicPlan.make(a.shape[0], ndev, T_A), caller)
    if not isinstance(a, jax.core.Tracer):
        a = jax.device_put(a, sharding)
    return jaxmg_layout.cyclic_1d_layout(a, T_A, sharding=sharding)


def _ndev_and_axis(A_cyclic, ndev, axis):
    sharding = getattr(A_cyclic, "sharding", None)
    if isinstance(sharding, NamedSharding) and (ndev is None or axis is None):
        found_axis, found_ndev = _sharded_axis(sharding, "jaxmg.verify_cyclic")
        ndev = found_ndev if ndev is None else ndev
        axis = found_axis if axis is None else axis
    return (jax.device_count() if ndev is None else ndev), (0 if axis is None else axis)


def verify_cyclic(
    A: np.typing.ArrayLike,
    A_cyclic: np.typing.ArrayLike,
    T_A: int,
    *,
    ndev: int | None = None,
    axis: int | None = None,
) -> None:
    """jaxmg 0.0.7's ``verify_cyclic``: assert that ``A_cyclic`` is ``A`` in the 1D
    block-cyclic layout with tile ``T_A``.

    Every row of ``A`` (column, for ``axis=1``) must be, up to ``np.allclose``, where the
    layout puts it: with the tile ``t = min(T_A, N/ndev)``, global row ``r`` of tile ``k = r //
    t`` at row ``d*L + (k // ndev)*t + r % t`` of ``A_cyclic``, ``d = k % ndev``. Padding rows
    are not inspected, as in 0.0.x.

    Args:
        A: the ``N x N`` matrix before the relayout (any array; it is copied to the host).
        A_cyclic: the relayouted matrix, ``ndev*L x N`` (``N x ndev*L`` for ``axis=1``), or
            ``N x N`` when ``T_A >= N/ndev``.
        T_A: the tile width of the relayout.
        ndev, axis: the device count and the relayouted axis (0: rows, 1: columns). ``None``
            reads them from ``A_cyclic``'s ``NamedSharding``, else uses 0.0.x's
            ``jax.device_count()`` and rows.

    Returns:
        ``None``, as 0.0.x.

    Raises:
        AssertionError: a row (column) out of place or ``A_cyclic`` of the wrong shape; the
            message names the first misplaced row (column).
        ValueError: ``N`` not divisible by ``ndev``, ``T_A <= 0``, ``axis`` not 0 or 1.
    """
    ndev, axis = _ndev_and_axis(A_cyclic, ndev, axis)
    if axis not in (0, 1):
        raise ValueError(f"jaxmg.verify_cyclic: axis must be 0 (rows) or 1 (columns), got {axis}.")
    A = np.asarray(A)
    A_cyclic = np.asarray(A_cyclic)
    if axis == 1:
        A, A_cyclic = A.T, A_cyclic.T
    plan = jaxmg_layout.CyclicPlan.make(A.shape[0], ndev, T_A)
    rows = ndev * plan.local_width
    assert A_cyclic.shape == (rows, A.shape[1]), (
        f"verify_cyclic: for N={plan.N}, T_A={T_A} on {ndev} devices the block-cyclic matrix "
        f"has {rows} {'rows' if axis == 0 else 'columns'} of {A.shape[1]}; got shape "
        f"{A_cyclic.shape if axis == 0 else A_cyclic.T.shape}."
    )
    where = plan.column_map().reshape(-1)  # global row at each row of A_cyclic, -1: padding
    for position in np.flatnonzero(where >= 0):
        source = where[position]
        assert np.allclose(A[source], A_cyclic[position]), (
            f"verify_cyclic: {'row' if axis == 0 else 'column'} {source} of A is not at "
            f"{'row' if axis == 0 else 'column'} {position} of A_cyclic (device "
            f"{position // plan.local_width}, tile {source // plan.tile}, T_A={T_A})."
        )


def manual_cyclic_1d_layout(a: np.typing.ArrayLike, T_A: int, ndev: int) -> jax.Array:
    """jaxmg 0.0.1's ``manual_cyclic_1d_layout``: the 1D block-cyclic column layout of an
    unsharded ``a``, built on one device (a reference for ``cyclic_1d_layout``).

    Args:
        a: ``M x N`` matrix (``N x N`` in 0.0.1), its columns to be laid out.
        T_A: tile width.
        ndev: the device count the layout is for; must divide ``N``.

    Returns:
        ``a`` itself if ``T_A >= N/ndev``; else the ``M x ndev*L`` array of ``a``'s dtype
        whose column block ``d`` (``L`` wide) holds global column tiles ``d, d + ndev, ...``
        in order, then zero columns: what ``cyclic_1d_layout`` gives for ``a`` sharded by
        columns over ``ndev`` devices. 0.0.1 also refused ``N/ndev < ndev`` and built its
        zeros in the default float dtype; neither is kept.

    Raises:
        ValueError: ``a`` not 2-D, ``N`` not divisible by ``ndev``, ``T_A`` or ``ndev`` not
            positive.
    """
    a = jnp.asarray(a)
    if a.ndim != 2:
        raise ValueError(
            f"jaxmg.manual_cyclic_1d_layout: a must be a 2-D matrix, got shape {a.shape}."
        )
    plan = jaxmg_layout.CyclicPlan.make(a.shape[1], ndev, T_A)
    if not plan.needs_relayout:
        return a
    where = plan.column_map().reshape(-1)
    columns = jnp.take(a, np.maximum(where, 0), axis=1)
    return jnp.where(where >= 0, columns, jnp.zeros((), a.dtype))


def plot_block_to_cyclic(N: int, T_A: int, ndev: int, N_rows: int = 8) -> tuple[Any, np.ndarray]:
    """jaxmg 0.0.x's ``plot_block_to_cyclic``: a picture of the column-block sharding of an
    ``N x N`` matrix on ``ndev`` devices and of its 1D block-cyclic layout with tile ``T_A``.

    It draws :func:`jaxmg_layout.plot_layout`'s picture (note the argument order: 0.0.x's
    ``N, T_A, ndev`` here, ``N, ndev, T_A`` there). ``axs[0]`` ("before") colours every
    global column by the device holding it in block sharding; ``axs[1]`` ("after") has one
    row per device, each local column coloured by the device that held it before, padding
    hatched grey. 0.0.x drew both as strips of global columns ``N_rows`` high; ``N_rows`` is
    accepted (a positive int) and not drawn.

    Returns:
        ``(fig, axs)``: the ``matplotlib`` figure and a numpy array of its two Axes.

    Raises:
        ImportError: matplotlib is not installed (``pip install matplotlib``, or the ``plot``
            extra ``pip install 'jaxmg[plot]'``).
        TypeError, ValueError: a non-positive or non-integer argument, ``N`` not divisible by
            ``ndev``.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "jaxmg.plot_block_to_cyclic draws with matplotlib, which is not installed: "
            "pip install matplotlib (or pip install 'jaxmg[plot]')."
        ) from err
    if isinstance(N_rows, bool) or not isinstance(N_rows, numbers.Integral) or N_rows <= 0:
        raise ValueError(
            f"jaxmg.plot_block_to_cyclic: N_rows must be a positive int, got {N_rows!r}."
        )
    fig = jaxmg_layout.plot_layout(N, ndev, T_A)
    return fig, np.array(fig.axes[:2], dtype=object)
