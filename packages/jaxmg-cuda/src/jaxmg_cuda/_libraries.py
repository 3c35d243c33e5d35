"""Where the CUDA libraries may live: NVIDIA's pip wheels first, then the system.

cuSolverMg and the CUDA runtime are opened with ``dlopen`` at the first GPU call, by soname
(``libcusolverMg.so.12`` + ``libcudart.so.13`` for CUDA 13, ``libcusolverMg.so.11`` +
``libcudart.so.12`` for CUDA 12), and backend ``"mp"``'s cuSOLVERMp (``libcusolverMp.so.0``,
in ``nvidia/cu13/lib`` or ``nvidia/cu12/lib``) and NCCL (``libnccl.so.2``, in
``nvidia/nccl/lib``) likewise. Nothing here imports or loads CUDA.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib

# Packages of NVIDIA's wheels whose lib/ folder may hold the libraries.
_WHEEL_PACKAGES = (
    "nvidia.cu13",
    "nvidia.cu12",
    "nvidia.cusolver",
    "nvidia.cuda_runtime",
    "nvidia.cublas",
    "nvidia.nccl",
)


def candidate_dirs() -> list[str]:
    dirs = []
    for name in _WHEEL_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        for root in (spec.submodule_search_locations or []) if spec else []:
            lib = pathlib.Path(root) / "lib"
            if lib.is_dir():
                dirs.append(str(lib))
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            dirs.append(str(pathlib.Path(os.environ[env]) / "lib64"))
    dirs.append("/usr/local/cuda/lib64")
    return dirs
