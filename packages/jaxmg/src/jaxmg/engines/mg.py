"""Backend ``"mg"``: cuSolverMg on GPUs and its LAPACK twin on CPUs, one node.

``jaxmg_cuda`` (an optional install, imported at the first call) registers both under the same
target names, so XLA picks the implementation by the platform it lowers for. One process drives
every device of the solver axis, or each process one device of the node (the native handlers
then meet through shared memory). The leader moves whole tiles between the devices' buffers into
the 1D block-cyclic layout and back, in place.

What cuSolverMg cannot do is this engine's to say: its ``getrs`` takes ``trans = N`` only (on
GPUs, info -1 for the others; its LAPACK twin refuses them too), so solves with ``A^T`` and
``A^H`` go through the factor of ``A^T`` built from ``A``'s; at most 16 GPUs in one call; the
tile limits of its syevd and getrf (:data:`GPU_MAX_TILE`).
"""

from __future__ import annotations

import functools
import types
import warnings

from ..describe import processes
from ..utils import JaxMgWarning
from .base import Engine, native_module

#: cuSolverMg's hard limit on the number of GPUs in one call.
MAX_GPUS = 16

#: The widest column tile cuSolverMg takes, per routine: syevd refuses tiles over 1024, getrf
#: tiles of 1024 and more (info -6, its matrix descriptor; docs/gpu.md).
GPU_MAX_TILE = {"syevd": 1024, "getrf": 512}

#: The automatic tile on GPUs (``T_A=None``): the widest tile each routine gets, and the
#: narrowest that cuSolverMg recommends ("256 or above"). See :func:`auto_tile`.
GPU_TILE_CAP = {"potrs": 4096, "potri": 4096, **GPU_MAX_TILE}
GPU_TILE_MIN = 256

_ROUTINES = (
    "potrs",
    "potri",
    "syevd",
    "potrf",
    "potrs_factored",
    "potri_factored",
    "getrf",
    "getrs",
)


@functools.cache
def _wrappers() -> types.SimpleNamespace:
    native = native_module("mg")
    return types.SimpleNamespace(**{r: getattr(native, f"mg_{r}") for r in _ROUTINES})


def check_cuda_support(caller: str, platform: str, backend: str = "mg") -> None:
    """Raises on GPUs when the installed jaxmg-cuda was built without CUDA."""
    if platform == "gpu" and not native_module(backend).has_cuda_support():
        raise RuntimeError(
            f"{caller}: A lives on GPUs but the installed jaxmg-cuda was built without CUDA "
            "support. Reinstall it with CUDA on (the default): "
            "pip install --force-reinstall ./packages/jaxmg-cuda"
        )


def check_device_count(ndev: int, platform: str, axis: str) -> None:
    if platform == "gpu" and ndev > MAX_GPUS:
        raise ValueError(
            f"A is sharded over {ndev} GPUs along {axis!r}; cuSolverMg accepts at most "
            f"{MAX_GPUS}. Use a mesh axis of at most {MAX_GPUS} devices."
        )


def auto_tile(n: int, ndev: int, routine: str, platform: str) -> int:
    """The tile size ``T_A=None`` stands for.

    With ``s = N / ndev`` columns per device:

    - CPU devices: ``s``. The LAPACK twin makes one library call whatever the tile, so the
      fastest call is the one with no relayout (the CPU tile sweep in ``benchmarks/results``).
    - GPUs: ``s`` when ``s`` is at most the routine's cap (``GPU_TILE_CAP``: 4096 for potrs and
      potri, the tile NetKet's jaxmg authors default to; cuSolverMg's limits for syevd, 1024,
      and getrf, 512): no relayout. Wider shards get the widest tile between 256
      (cuSolverMg's recommended minimum) and the cap that divides ``s`` (whole tiles move),
      else the cap.
    """
    s = n // ndev
    if platform != "gpu":
        return s
    cap = GPU_TILE_CAP[routine]
    if s <= cap:
        return s
    return next((t for t in range(cap, GPU_TILE_MIN - 1, -1) if s % t == 0), cap)


class CuSolverMg(Engine):
    name = "mg"
    summary = "cuSolverMg, 1D"
    moves_in_place = True
    transposes_factor = True
    native = True

    def routines(self, platform, caller):
        self.handlers(caller)
        check_cuda_support(caller, platform)
        return _wrappers()

    def load(self, caller, platform):
        self.handlers(caller)

    def solves_transposed(self, platform):
        return False

    def tile(self, T_A, n, ndev, routine, platform, caller, pad):
        """:func:`auto_tile` for ``None``; on GPUs a syevd or getrf tile
        over cuSolverMg's limit is lowered to it with a warning, as jaxmg 0.0.x did for syevd."""
        if T_A is None:
            return auto_tile(n, ndev, routine, platform)
        limit = GPU_MAX_TILE.get(routine) if platform == "gpu" else None
        if limit is not None and min(T_A, n // ndev) > limit:
            warnings.warn(
                f"{caller}: cuSolverMg's {routine} accepts column tiles of at most {limit}; "
                f"T_A={T_A} is lowered to {limit}.",
                JaxMgWarning,
                stacklevel=5,
            )
            return limit
        return T_A

    def refusal(self, mesh, axes, platform, caller):
        try:
            self.participants(mesh, axes, platform, caller)
        except ValueError as error:
            return str(error)
        return None

    def participants(self, mesh, axes, platform, caller):
        (axis,) = axes
        device_ids, job, pids = processes.participants(mesh, axis, platform)
        check_device_count(len(device_ids), platform, axis)
        return len(device_ids), device_ids, job, pids

    def job_attributes(self, geometry):
        return {"job": geometry.job, "pids": geometry.pids or None}

    def max_devices(self, platform):
        return MAX_GPUS if platform == "gpu" else None


ENGINE = CuSolverMg()
