"""The multi-node recipe: cuSolverMg solves within one node, so gather ``A`` onto every node.

With ``jax.distributed`` over several nodes (one process per node driving its devices), a
matrix sharded over *all* devices cannot be handed to cuSolverMg. Instead:

1. ``mesh = host_mesh()``: a 2-D mesh ``("host", "x")`` whose row ``p`` is process ``p``'s
   devices;
2. ``A = gather_to_hosts(A, mesh)``: every process holds all of ``A``, split over its own
   devices along ``"x"`` (one all-gather across nodes);
3. any jaxmg routine: each node solves on its own devices; results come back replicated
   over ``"host"``.

Memory per device is ``N^2 / local_device_count`` instead of ``N^2 / device_count``.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from ..describe.sharding import _placed


def host_mesh(
    axis_names: tuple[str, str] = ("host", "x"), *, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A 2-D mesh ``[processes, local devices]``: row ``p`` holds process ``p``'s devices.

    Args:
      axis_names: names of the process axis and the local-device axis.
      devices: the devices to use (default: ``jax.devices()``, every device of the job).

    Raises:
      ValueError: the processes hold different numbers of the devices.
    """
    devices = jax.devices() if devices is None else list(devices)
    by_process: dict[int, list] = {}
    for d in devices:
        by_process.setdefault(d.process_index, []).append(d)
    counts = {p: len(ds) for p, ds in sorted(by_process.items())}
    if len(set(counts.values())) != 1:
        raise ValueError(
            f"host_mesh needs the same number of devices in every process, found {counts} "
            "(process index: devices)."
        )
    grid = np.array([sorted(by_process[p], key=lambda d: d.id) for p in sorted(by_process)])
    return Mesh(grid, tuple(axis_names))


def gather_to_hosts(A: jax.Array, mesh: Mesh, axis: str | None = None) -> jax.Array:
    """``A`` resharded so that every process holds all of it, split over its own devices.

    Args:
      A: ``[N, N]`` jax.Array, sharded in any way over ``mesh``'s devices (typically
        ``P(None, ("host", "x"))``).
      mesh: a mesh from :func:`host_mesh` (or any 2-D ``[processes, local devices]`` mesh).
      axis: the local-device axis (default: ``mesh``'s second axis).

    Returns:
      ``A`` sharded ``P(None, axis)`` (columns) or, when ``A`` is sharded by rows,
      ``P(axis, None)``; replicated over the process axis. Works eagerly and under ``jit``.
    """
    if len(mesh.axis_names) != 2:
        raise ValueError(
            f"gather_to_hosts needs a 2-D [processes, local devices] mesh such as "
            f"jaxmg.host_mesh(), got axes {mesh.axis_names}."
        )
    axis = mesh.axis_names[1] if axis is None else axis
    if axis not in mesh.axis_names:
        raise ValueError(f"axis {axis!r} is not an axis of the mesh {mesh.axis_names}.")
    spec = getattr(getattr(A, "sharding", None), "spec", None)
    by_rows = spec is not None and len(spec) >= 1 and spec[0] is not None
    return _placed(A, mesh, P(axis, None) if by_rows else P(None, axis))
