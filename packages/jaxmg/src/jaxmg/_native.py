"""The one place the facade reaches the engines.

``jaxmg_cuda`` registers two engines' targets. Backend ``"mg"``: cuSolverMg on GPUs and its
LAPACK twin on CPUs, under the same names, so XLA picks the implementation by the platform it
lowers for. Backend ``"mp"``: the distributed engine, one process per device (on CPUs
ScaLAPACK over MPI; on GPUs cuSOLVERMp over NCCL, which takes the
communicator's id as well). Backend ``"jax"`` (internal, chosen for a solver axis of one device,
never a public ``backend=`` value): JAX's own dense solvers (:mod:`jaxmg._dense`).
:func:`engine` hands the solvers one engine's wrappers under neutral names (``potrs``,
``getrf``, ...), which take the same arguments, and refuses early, with a way out, what the
installed package cannot run.

Every engine also says whether its ``getrs`` solves with ``A^T`` and ``A^H``
(``solves_transposed``): cuSolverMg's takes only ``trans = N`` (on GPUs, info -1 for the others;
its LAPACK twin refuses them too), as does cuSOLVERMp's (NVIDIA's header and samples); ScaLAPACK's
and the dense solvers' take all three.
"""

from __future__ import annotations

import functools
import os
import types

import jaxmg_cuda

from . import _dense, _processes

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

_MG = types.SimpleNamespace(
    solves_transposed=False, **{r: getattr(jaxmg_cuda, f"mg_{r}") for r in _ROUTINES}
)
_MP_CPU = types.SimpleNamespace(
    solves_transposed=True, **{r: getattr(jaxmg_cuda.mp, r) for r in _ROUTINES}
)


def _refuse(caller: str, what: str):
    def refuse(*args, **kwargs):
        raise NotImplementedError(
            f"{caller}: backend='mp' on GPUs has no {what}: cuSOLVERMp has no inverse and "
            "solves only A x = b, one right-hand side at a time. On one node backend='mg' has "
            "it; across nodes, jaxmg.gather_to_hosts(A, jaxmg.host_mesh()) gathers A onto each "
            "node to solve there."
        )

    return refuse


def _mp_gpu(caller: str):
    """The ``"mp"`` wrappers on GPUs: cuSOLVERMp over this job's NCCL communicator, with what
    it cannot do refused at trace time."""
    nccl_id = jaxmg_cuda.mp.nccl_id()
    wrappers = {r: functools.partial(getattr(jaxmg_cuda.mp, r), nccl_id=nccl_id) for r in _ROUTINES}
    inverse = _refuse(caller, "inverse (potri, and the derivative of a log-determinant)")
    transposed = _refuse(
        caller,
        "solve with A^T or A^H (lu_solve with trans=1 or 2, and derivatives through lu_solve)",
    )

    solve = wrappers["getrs"]

    def getrs(*args, trans="N", **kwargs):
        if trans != "N":
            transposed()
        return solve(*args, trans=trans, **kwargs)

    wrappers.update(potri=inverse, potri_factored=inverse, getrs=getrs)
    return types.SimpleNamespace(solves_transposed=False, **wrappers)


def engine(platform: str, caller: str, backend: str = "mg"):
    """The wrappers of ``backend`` (``"mg"``, ``"mp"`` or ``"jax"``) on ``platform``."""
    if backend == "jax":
        return _dense.engine(platform)
    if backend == "mp":
        return _mp_gpu(caller) if platform == "gpu" else _MP_CPU
    if platform == "gpu" and not jaxmg_cuda.has_cuda_support():
        raise RuntimeError(
            f"{caller}: A lives on GPUs but the installed jaxmg-cuda was built without CUDA "
            "support. Reinstall it with CUDA on (the default): "
            "pip install --force-reinstall ./packages/jaxmg-cuda"
        )
    return _MG


def load_mp(caller: str, platform: str) -> None:
    """Open the ``"mp"`` engine's libraries in this process, or raise: on CPUs ScaLAPACK over
    MPI; on GPUs NCCL and cuSOLVERMp, whose communicator's id the processes share here."""
    if platform == "gpu" and not jaxmg_cuda.has_cuda_support():
        raise RuntimeError(
            f"{caller}: A lives on GPUs but the installed jaxmg-cuda was built without CUDA "
            "support. Reinstall it with CUDA on (the default): "
            "pip install --force-reinstall ./packages/jaxmg-cuda"
        )
    if platform == "gpu" and os.environ.get(_processes.GPU_MULTIPROCESS_ENV) != "1":
        raise NotImplementedError(
            f"{caller}: backend='mp' on GPUs (cuSOLVERMp over NCCL) has run on one GPU but not "
            "yet on several, so it is off by default: set "
            f"{_processes.GPU_MULTIPROCESS_ENV}=1 in every process to try it. On one node "
            "backend='mg' runs; across nodes, jaxmg.gather_to_hosts(A, jaxmg.host_mesh()) "
            "gathers A onto each node to solve there."
        )
    try:
        if platform == "gpu":
            jaxmg_cuda.mp.nccl_id()
        else:
            jaxmg_cuda.mp.load()
    except RuntimeError as error:
        raise RuntimeError(f"{caller}: {error}") from error
