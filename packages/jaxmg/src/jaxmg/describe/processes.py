"""Which processes drive a call's devices, and what the processes of a job agreed on.

jaxmg solves in one of two setups, found at call time (never at import):

- single-process: this process drives every device of the solver axis;
- multi-process: one device per process, every process on this host (``jax.distributed``,
  e.g. one process per GPU under ``srun``/``mpirun``). The native handlers then meet through
  shared memory under a token the processes agreed on (on GPUs the buffers themselves stay
  on their devices and the leader maps them with CUDA IPC: opt-in, see
  :func:`check_gpu_multiprocess_enabled`).

Anything else (devices of the axis on several hosts, or several processes each holding several
devices of it) is refused with an error that says what was found; for several hosts see
:func:`jaxmg.gather_to_hosts`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import os
import socket

import jax
import numpy as np

#: Device id used in the rendezvous key when the concrete devices are not known at trace time
#: (inside a user's ``shard_map``): the native code then takes each participant's own device.
UNKNOWN_DEVICE = -1

#: Opts in to the multi-process mode on GPUs, which has not yet run on GPU hardware.
GPU_MULTIPROCESS_ENV = "JAXMG_GPU_MULTIPROCESS"


@dataclasses.dataclass(frozen=True)
class Job:
    """What every process of a ``jax.distributed`` job knows about all of them.

    Attributes:
      token: a random nonzero 63-bit number drawn by process 0: names shared objects, so two
        jobs on one host never meet.
      pids: the operating-system process id of each process, by ``jax.process_index()``.
      hosts: a hash of each process's host name, by process index.
    """

    token: int
    pids: tuple[int, ...]
    hosts: tuple[int, ...]


def _host_hash() -> int:
    name = socket.gethostname().encode()
    return int.from_bytes(hashlib.sha256(name).digest()[:7], "little")


@functools.lru_cache(maxsize=1)
def job() -> Job:
    """The job's shared facts, gathered once with one collective over every process.

    Every process must reach its first multi-process jaxmg call (they all do: a jax.distributed
    program runs the same calls in the same order). That call may be traced (the first call of
    a job is often under ``jit``), and a collective cannot run inside a trace; tracing state
    belongs to a thread, so the gather runs on a thread of its own.
    """
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxmg-job") as pool:
        table = pool.submit(_gather_job_table).result()
    return Job(
        token=int(table[0, 2]),
        pids=tuple(int(p) for p in table[:, 0]),
        hosts=tuple(int(h) for h in table[:, 1]),
    )


def _gather_job_table() -> np.ndarray:
    """``[processes, 3]``: each process's (pid, host hash, random token)."""
    from jax.experimental import multihost_utils

    mine = np.array(
        [os.getpid(), _host_hash(), int.from_bytes(os.urandom(8), "little") >> 1 | 1], np.int64
    )
    return np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 3)


def classify(processes, axis: str) -> str:
    """``"single"`` or ``"multi"`` for the processes of one slice of the solver axis.

    Args:
      processes: the process index of each device of the slice, in mesh order.
      axis: the mesh axis, for messages.

    Raises:
      ValueError: the slice spans several processes that each hold more than one of its
        devices.
    """
    processes = [int(p) for p in processes]
    distinct = sorted(set(processes))
    if len(distinct) == 1:
        return "single"
    if len(distinct) != len(processes):
        counts = {p: processes.count(p) for p in distinct}
        raise ValueError(
            f"mesh axis {axis!r} spans {len(distinct)} processes holding {counts} of its "
            f"{len(processes)} devices; jaxmg solves with one process driving every device of "
            "the axis, or with one device per process (all on one host)."
        )
    return "multi"


def check_one_host(processes, hosts, axis: str) -> None:
    """Raises ValueError unless the ``processes`` (indices into ``hosts``, the host hash of
    each process) all run on one host: cuSolverMg solves within one node."""
    if len({hosts[int(p)] for p in processes}) > 1:
        raise ValueError(
            f"mesh axis {axis!r} spans processes on several hosts; backend='mg' (cuSolverMg) "
            "solves within one node. Use backend='mp' (the distributed engine, the default "
            "across hosts), or gather A onto each host first: "
            "jaxmg.gather_to_hosts(A, jaxmg.host_mesh()) (see docs/multi-node.md)."
        )


def check_gpu_multiprocess_enabled(axis: str) -> None:
    """Raises NotImplementedError unless ``JAXMG_GPU_MULTIPROCESS=1``.

    One GPU per process (CUDA IPC between the processes) runs only when asked for, until a GPU
    machine has validated it (docs/gpu.md).
    """
    if os.environ.get(GPU_MULTIPROCESS_ENV) != "1":
        raise NotImplementedError(
            f"mesh axis {axis!r} has one GPU per process. That mode (CUDA IPC between the "
            "processes) is built but has not yet run on GPU hardware, so it is off by default: "
            f"set {GPU_MULTIPROCESS_ENV}=1 in every process to try it (every process must see "
            "every GPU of the node), or run one process per node that drives all of its GPUs."
        )


def check_gpus_visible(ndev: int, axis: str, visible: str | None = None) -> None:
    """Raises ValueError when ``CUDA_VISIBLE_DEVICES`` hides GPUs of the axis from this process.

    In the multi-process mode the leader maps every other process's GPU memory and runs
    cuSolverMg on all the GPUs, so each process must see them all (each picks its own GPU
    with ``jax.distributed.initialize(local_device_ids=...)``). ``visible`` defaults to the
    environment's value.
    """
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return
    listed = [entry for entry in visible.split(",") if entry.strip()]
    if len(listed) < ndev:
        raise ValueError(
            f"mesh axis {axis!r} has one GPU per process on {ndev} GPUs, but this process sees "
            f"only CUDA_VISIBLE_DEVICES={visible!r}. In the multi-process mode every process "
            "must see every GPU of the axis: leave CUDA_VISIBLE_DEVICES unset (or list them "
            "all) and pick each process's GPU with "
            "jax.distributed.initialize(local_device_ids=...)."
        )


# --- the devices of one call's solver axis ----------------------------------------------------


def _check_single_slice(mesh, axis: str) -> None:
    others = {name: size for name, size in mesh.shape.items() if name != axis}
    if any(size > 1 for size in others.values()):
        raise ValueError(
            f"cannot tell which devices along mesh axis {axis!r} run together from the "
            f"abstract mesh {dict(mesh.shape)}: call with a concrete mesh= whose other axes "
            "place one slice in this process."
        )


def local_slice(owners: np.ndarray, me: int, axis: str, shape: dict) -> int:
    """Index of the one slice of ``axis`` this process takes part in; an error for any other setup.

    ``owners[r, j]``: the process of device ``j`` in slice ``r``. Each process solves on one
    slice (the others, on other processes, solve on theirs).
    """
    mine = [r for r in range(owners.shape[0]) if (owners[r] == me).any()]
    if len(mine) != 1:
        raise ValueError(
            f"this process holds devices in {len(mine)} slices of mesh axis {axis!r} "
            f"(mesh {shape}); jaxmg solves on exactly one slice per process: shard A "
            "over an axis whose other mesh axes place one slice in this process."
        )
    return mine[0]


@functools.lru_cache(maxsize=64)
def participants(mesh, axis: str, platform: str):
    """``(device_ids, job, pids)`` of this process's slice of ``axis``, in mesh order.

    Cached per mesh: an eager call would otherwise walk the mesh's devices every time."""
    if not isinstance(mesh, jax.sharding.Mesh):
        return abstract_participants(mesh, axis, platform)
    ndev = dict(mesh.shape)[axis]
    grid = np.moveaxis(mesh.devices, mesh.axis_names.index(axis), -1).reshape(-1, ndev)
    owners = np.vectorize(lambda d: d.process_index, otypes=[np.int64])(grid)
    r = local_slice(owners, jax.process_index(), axis, dict(mesh.shape))
    row = grid[r]
    if platform == "gpu":
        ids = tuple(int(d.local_hardware_id) for d in row)
    else:
        ids = tuple(int(d.id) for d in row)
    if classify(owners[r], axis) == "single":
        return ids, 0, ()
    job = _multi_process_job(owners[r], ndev, axis, platform)
    if platform == "gpu":
        # Remote devices have no local hardware id here; the native leader finds each GPU by
        # its PCI bus id, and the ids only name the call.
        ids = tuple(int(d.id) for d in row)
    return ids, job.token, tuple(job.pids[int(p)] for p in owners[r])


def _multi_process_job(processes, ndev: int, axis: str, platform: str) -> Job:
    """The job's shared facts, after checking the multi-process mode may run on ``processes``."""
    shared = job()
    check_one_host(processes, shared.hosts, axis)
    if platform == "gpu":
        check_gpu_multiprocess_enabled(axis)
        check_gpus_visible(ndev, axis)
    return shared


def abstract_participants(mesh, axis: str, platform: str):
    """``(device_ids, job, pids)`` when only the abstract mesh is known (under ``jit`` without a
    concrete mesh, or inside a user's ``shard_map``).

    The devices are then unknown (``UNKNOWN_DEVICE``: each participant takes its own), and so
    is which process holds which mesh position (``pids`` of 0: the native protocol learns the
    leader's process when it arrives). Two setups can be told apart from the job alone: one
    process driving every device of the axis, and an axis over every device of the job with
    one device per process. Anything else needs the concrete mesh.
    """
    _check_single_slice(mesh, axis)
    ndev = dict(mesh.shape)[axis]
    unknown = (UNKNOWN_DEVICE,) * ndev
    if jax.process_count() == 1:
        return unknown, 0, ()
    local = jax.local_device_count(platform)
    if ndev == jax.device_count(platform) and local == 1:
        processes = list(range(jax.process_count()))
        job = _multi_process_job(processes, ndev, axis, platform)
        return unknown, job.token, (0,) * ndev
    raise ValueError(
        f"cannot tell which processes hold the {ndev} devices of mesh axis {axis!r} from the "
        f"abstract mesh {dict(mesh.shape)} ({jax.process_count()} processes with {local} "
        f"{platform} device(s) each): pass the concrete jax.sharding.Mesh as mesh= (for the "
        "*_no_shardmap functions, call jaxmg.potrs/potri/syevd with it instead)."
    )
