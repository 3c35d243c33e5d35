"""The one place the facade reaches the native package.

``jaxmg_cuda`` registers two engines' targets. Backend ``"mg"``: cuSolverMg on GPUs and its
LAPACK twin on CPUs, under the same names, so XLA picks the implementation by the platform it
lowers for. Backend ``"mp"``: the distributed engine, one process per device (on CPUs
ScaLAPACK over MPI; cuSOLVERMp on GPUs is not built yet). :func:`engine` hands the solvers
one engine's wrappers under neutral names (``potrs``, ``getrf``, ...), which take the same
arguments, and refuses early, with a way out, what the installed package cannot run.
"""

from __future__ import annotations

import types

import jaxmg_cuda

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

_MG = types.SimpleNamespace(**{r: getattr(jaxmg_cuda, f"mg_{r}") for r in _ROUTINES})
_MP_CPU = types.SimpleNamespace(**{r: getattr(jaxmg_cuda.mp, r) for r in _ROUTINES})


def engine(platform: str, fn: str, backend: str = "mg"):
    """The native wrappers of ``backend`` (``"mg"`` or ``"mp"``) on ``platform``."""
    if backend == "mp":
        if platform == "gpu":
            raise NotImplementedError(
                f"{fn}: backend='mp' on GPUs (cuSOLVERMp) is not built yet. On one node use "
                "backend='mg'; across nodes, gather A onto each node with "
                "jaxmg.gather_to_hosts(A, jaxmg.host_mesh()) and solve there."
            )
        return _MP_CPU
    if platform == "gpu" and not jaxmg_cuda.has_cuda_support():
        raise RuntimeError(
            f"{fn}: A lives on GPUs but the installed jaxmg-cuda was built without CUDA "
            "support. Reinstall it with CUDA on (the default): "
            "pip install --force-reinstall ./packages/jaxmg-cuda"
        )
    return _MG


def load_mp(fn: str) -> None:
    """Open the ``"mp"`` engine's library (ScaLAPACK over MPI) in this process, or raise."""
    try:
        jaxmg_cuda.mp.load()
    except RuntimeError as error:
        raise RuntimeError(f"{fn}: {error}") from error
