"""Backend ``"mp"``: the distributed engine, one process per device, over a 1D axis or a 2D
process grid ``P(r, c)``. On CPUs ScaLAPACK over MPI, which also redistributes JAX's blocks to
its tiles itself (p?gemr2d) and has its own SVD, QR and least squares; on GPUs cuSOLVERMp over
NCCL, which takes the communicator's id as well, and has neither an inverse nor solves with
``A^T`` (NVIDIA's header and samples): those are refused at trace time, with a way out.
"""

from __future__ import annotations

import functools
import math
import os
import types

import jax
import numpy as np

from ..describe import checks, processes
from . import mg
from .base import Engine, native_module

_ROUTINES = mg._ROUTINES


def targets():
    """``jaxmg_cuda.mp``, the engine's targets (jaxmg-cuda is an optional install: an
    ImportError saying how to install it where it is missing)."""
    return native_module("mp", "mpi").mp


@functools.cache
def _cpu() -> types.SimpleNamespace:
    return types.SimpleNamespace(**{r: getattr(targets(), r) for r in _ROUTINES})


def _refuse(caller: str, what: str):
    def refuse(*args, **kwargs):
        raise NotImplementedError(
            f"{caller}: backend='mp' on GPUs has no {what}: cuSOLVERMp has no inverse and "
            "solves only A x = b, one right-hand side at a time. On one node backend='mg' has "
            "it; across nodes, jaxmg.gather_to_hosts(A, jaxmg.host_mesh()) gathers A onto each "
            "node to solve there."
        )

    return refuse


def _gpu(caller: str) -> types.SimpleNamespace:
    """The wrappers on GPUs: cuSOLVERMp over this job's NCCL communicator, with what it cannot
    do refused at trace time."""
    nccl_id = targets().nccl_id()
    wrappers = {r: functools.partial(getattr(targets(), r), nccl_id=nccl_id) for r in _ROUTINES}
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
    return types.SimpleNamespace(**wrappers)


def processes_of(mesh, axes: tuple[str, ...], platform: str, caller: str) -> int:
    """The number of processes of a ``"mp"`` call after checking its setup: the mesh ``axes``
    (one, or ``P(r, c)``'s two) hold one device of every process of the job, in process order
    (row-major over a grid), and the mesh nothing else."""
    shape = dict(mesh.shape)
    ndev, count = math.prod(shape[a] for a in axes), jax.process_count()
    others = {name: size for name, size in shape.items() if name not in axes and size > 1}
    listed = " x ".join(map(repr, axes))
    named = ("mesh axis " if len(axes) == 1 else "mesh axes ") + listed
    if isinstance(mesh, jax.sharding.Mesh):
        order = [mesh.axis_names.index(a) for a in axes]
        order += [i for i in range(len(mesh.axis_names)) if i not in order]
        owners = [d.process_index for d in np.transpose(mesh.devices, order).flat]
        if sorted(owners) == list(range(count)) and owners != sorted(owners):
            raise ValueError(
                f"{caller}: backend='mp' needs the devices of {named} in process order (position p "
                f"on process p, row-major; found processes {owners}): ScaLAPACK's grid follows "
                "the MPI ranks. Build the mesh with jax.make_mesh, or sort its devices by "
                "process_index."
            )
        fits = owners == list(range(count))
    else:
        fits = jax.local_device_count(platform) == 1
    if others or ndev != count or not fits:
        raise ValueError(
            f"{caller}: backend='mp' runs one process per device over every process of the job: "
            f"{named} must hold exactly one device of each of the {count} processes, and "
            f"no other axis may split it; found the mesh {shape}"
            + ("" if others else f" with {ndev} device(s) on {listed}")
            + ". Launch one process per device (mpiexec -n P python prog.py, each initialising "
            "jax.distributed with one local device)."
        )
    return ndev


class Distributed(Engine):
    name = "mp"
    summary = "the distributed engine, one process per device"
    takes_grid = True
    own_qr = True
    native = True
    extra = "mpi"

    def routines(self, platform, caller):
        self.handlers(caller)
        return _gpu(caller) if platform == "gpu" else _cpu()

    def solves_transposed(self, platform):
        return platform != "gpu"

    def relays_blocks(self, platform):
        return platform != "gpu"  # ScaLAPACK's p?gemr2d; cuSOLVERMp has no such routine

    def inverts(self, platform):
        return platform != "gpu"

    def tile(self, T_A, n, ndev, routine, platform, caller, pad):
        return checks.mp_tile((n // ndev,), pad) if T_A is None else T_A

    def load(self, caller, platform):
        """Opens ScaLAPACK over MPI on CPUs; on GPUs NCCL and cuSOLVERMp, whose communicator's
        id the processes share here."""
        self.handlers(caller)
        mg.check_cuda_support(caller, platform, self.name)
        if platform == "gpu" and os.environ.get(processes.GPU_MULTIPROCESS_ENV) != "1":
            raise NotImplementedError(
                f"{caller}: backend='mp' on GPUs (cuSOLVERMp over NCCL) has run on one GPU but "
                "not yet on several, so it is off by default: set "
                f"{processes.GPU_MULTIPROCESS_ENV}=1 in every process to try it. On one node "
                "backend='mg' runs; across nodes, jaxmg.gather_to_hosts(A, jaxmg.host_mesh()) "
                "gathers A onto each node to solve there."
            )
        try:
            if platform == "gpu":
                targets().nccl_id()
            else:
                targets().load()
        except RuntimeError as error:
            raise RuntimeError(f"{caller}: {error}") from error

    def refusal(self, mesh, axes, platform, caller):
        try:
            processes_of(mesh, axes, platform, caller)
        except ValueError as error:
            return str(error)
        return None

    def participants(self, mesh, axes, platform, caller):
        ndev = processes_of(mesh, axes, platform, caller)
        return ndev, (processes.UNKNOWN_DEVICE,) * ndev, 0, ()

    def job_attributes(self, geometry):
        return {"grid": geometry.grid}


ENGINE = Distributed()
