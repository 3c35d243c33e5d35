"""Backend "mp": a distributed engine, one process per mesh position.

The targets ``jaxmg_mp_<routine>`` are registered at import for two engines with the same
operands and results. On CPUs: MKL's ScaLAPACK with BLACS over MPICH, from pip (``pip install
'jaxmg[mpi]'``: ``mkl``, ``mpich``, ``mpi4py``), opened by :func:`load` before the first call;
processes are started by ``mpiexec -n P`` and every one of them takes part in every call (the
grid holds every MPI process of the job). On GPUs: NVIDIA's
cuSOLVERMp over an NCCL communicator of jaxmg's own (``pip install nvidia-cusolvermp-cu12
nvidia-nccl-cu12``, or the ``-cu13`` pair), whose unique id :func:`nccl_id` makes on process 0
and shares through ``jax.distributed``; the wrappers take it as ``nccl_id``. cuSOLVERMp has no
redistribution (``blocks``), and no inverse: ``potri`` solves with the identity there.

Local arrays (the wrappers run inside ``jax.shard_map``, one device per process): ``a`` is
``[C, LLD]``, the column-major storage of this process's part of the 2D block-cyclic layout
with square tiles ``T_A`` over a ``rows x cols`` process grid (``jaxmg_layout.BlockCyclic2D``),
``LLD`` at least the local row count and ``C`` at least the local column count: every process
passes the same, largest, shape. On a ``1 x P`` grid that is exactly the ``[L, N]`` tile array
of the ``mg`` targets. ``b``/``x`` are ``[nrhs, N]``, the same on every process; ``w`` is
``[N]``; pivots are ScaLAPACK's distributed ``ipiv``, ``[LLD + T_A]`` per process.

The wrappers take the arguments of the ``mg`` wrappers (:mod:`jaxmg_cuda`), so that one caller
serves both: ``device_ids`` is accepted and unused, ``moves`` must be empty (the relayout runs
in JAX before the call), and ``grid`` (``(rows, cols)``) replaces ``job``/``pids``. ``position``
is this process's flat grid position ``r * cols + c`` (from ``lax.axis_index``); the processes
tell each other their positions at the call, so no process needs the others' MPI ranks.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import itertools
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from . import (
    _jaxmg_cuda,
    _ops as _ops,  # registers the state type of the CPU targets' instantiate stage
)

# A new id per traced call, the same on every process (they trace the same program): the
# processes agree on the order of calls by it (csrc/engines/scalapack_engine.h).
_call_ids = itertools.count(1)

#: The wheels' libraries, in dependency order: MPICH's libmpi (for BLACS), then MKL's core,
#: threading layer, interface, BLACS for MPICH/Intel MPI and ScaLAPACK.
LIBRARIES = (
    ("mpich", "libmpi.so.12"),
    ("mkl", "libmkl_core.so.3"),
    ("mkl", "libmkl_sequential.so.3"),
    ("mkl", "libmkl_intel_lp64.so.3"),
    ("mkl", "libmkl_blacs_intelmpi_lp64.so.2"),
    ("mkl", "libmkl_scalapack_lp64.so.2"),
)

_handles: list = []


def _register_targets() -> None:
    # Each target: {stage: capsule}; _ops registered the CPU state type (csrc/ffi/instance.h).
    for name, stages in _jaxmg_cuda.mp_targets().items():
        jax.ffi.register_ffi_target(name, stages, platform="cpu")
    for name, stages in _jaxmg_cuda.mp_targets(cuda=True).items():
        jax.ffi.register_ffi_target(name, stages, platform="CUDA")


_register_targets()


def _find(distribution: str, name: str) -> pathlib.Path | None:
    """Where ``name`` is: in the files of the pip ``distribution``, else in ``sys.prefix/lib``."""
    stem = name.split(".so")[0] + ".so"
    try:
        files = importlib.metadata.files(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    found = [f for f in files if pathlib.PurePath(str(f)).name.startswith(stem)]
    exact = [f for f in found if pathlib.PurePath(str(f)).name == name]
    for f in exact or found:
        path = pathlib.Path(f.locate())
        if path.exists():
            return path
    fallback = pathlib.Path(sys.prefix) / "lib" / name
    return fallback if fallback.exists() else None


def loaded() -> bool:
    """Whether ScaLAPACK and BLACS are loaded in this process."""
    return not _jaxmg_cuda.scalapack_missing()


def load() -> None:
    """Initialise MPI (through ``mpi4py``) and open MKL's ScaLAPACK, once per process.

    Raises:
      RuntimeError: a wheel is missing; the message names the ``pip install`` that fixes it.
    """
    if loaded():
        return
    try:
        from mpi4py import MPI  # noqa: F401  (MPI_Init, with MPI_THREAD_MULTIPLE)
    except ImportError as error:
        raise RuntimeError(
            "backend='mp' on CPUs needs mpi4py, MKL's ScaLAPACK and MPICH: "
            "pip install 'jaxmg[mpi]' (or: pip install mkl mpich mpi4py)"
        ) from error
    mode = ctypes.RTLD_GLOBAL | os.RTLD_LAZY
    for distribution, name in LIBRARIES:
        path = _find(distribution, name)
        if path is None:
            raise RuntimeError(
                f"backend='mp' on CPUs: {name} not found (from the pip package "
                f"{distribution!r}): pip install 'jaxmg[mpi]' (or: pip install mkl mpich mpi4py)"
            )
        _handles.append(ctypes.CDLL(str(path), mode=mode))
    missing = _jaxmg_cuda.scalapack_missing()
    if missing:
        raise RuntimeError(f"MKL's ScaLAPACK was opened but lacks: {missing}")


def cusolvermp_version() -> tuple[str | None, bool]:
    """The loaded cuSOLVERMp: its version as ``"0.8.0"`` (``None`` until a backend ``"mp"`` call
    on a GPU has made this process's handle: cuSOLVERMp tells its version through a handle)
    and whether it has ``cusolverMpGesvd`` (0.9.0 on: without it, jaxmg's ``svd``, ``gesvd``
    and ``polar`` on GPUs run jaxmg's compositions instead). Loads the libraries on first use.

    Raises:
      RuntimeError: no CUDA build, or the CUDA runtime, NCCL or cuSOLVERMp cannot be loaded.
    """
    if not hasattr(_jaxmg_cuda, "cusolvermp_version"):
        raise RuntimeError("jaxmg_cuda was built without CUDA support")
    number, gesvd = _jaxmg_cuda.cusolvermp_version()
    if number == 0:
        return None, bool(gesvd)
    return f"{number // 1000}.{number % 1000 // 100}.{number % 100}", bool(gesvd)


_nccl_ids: dict[str, np.ndarray] = {}


def nccl_id() -> np.ndarray:
    """The NCCL unique id of this job's communicator on GPUs, as 16 int64: process 0 makes it
    (``ncclGetUniqueId``) and every process receives it through ``jax.distributed``
    (``process_allgather``), once per process. Every process must call it (at trace time: they
    trace the same program).

    Raises:
      RuntimeError: the CUDA runtime, NCCL or cuSOLVERMp cannot be loaded (the message names the
        wheels to install).
    """
    if "job" not in _nccl_ids:
        import concurrent.futures

        from jax.experimental import multihost_utils

        made = _jaxmg_cuda.nccl_unique_id() if jax.process_index() == 0 else bytes(128)
        mine = np.frombuffer(made, np.int64)
        # A collective of its own: run it outside any trace context of this thread.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxmg-nccl") as pool:
            every = pool.submit(multihost_utils.process_allgather, mine).result()
        _nccl_ids["job"] = np.asarray(every, np.int64).reshape(-1, mine.size)[0].copy()
    return _nccl_ids["job"]


def _attrs(T_A, n, grid, moves, a_width, blocks, discard=False, nccl_id=None):
    if moves is not None and any(np.asarray(m).size for m in moves):
        raise ValueError("backend 'mp' takes no in-place moves: relayout in JAX before the call")
    if nccl_id is not None and blocks:
        raise ValueError("backend 'mp' on GPUs takes no blocks: relayout in JAX before the call")
    rows, cols = (int(v) for v in grid)
    attrs = dict(
        T_A=np.int64(T_A),
        n=np.int64(a_width if n is None else n),
        grid=np.asarray((rows, cols), np.int64),
        blocks=np.int64(2 if blocks and discard else int(bool(blocks))),
        call_id=np.int64(next(_call_ids)),
    )
    if nccl_id is not None:  # the GPU engine's communicator
        attrs["nccl_id"] = np.asarray(nccl_id, np.int64).reshape(16)
    return attrs


def _status():
    return jax.ShapeDtypeStruct((1,), jnp.int32)


def _like(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _position(position):
    return jnp.asarray(position, jnp.int32)


def _in_place(target, a, position, attrs):
    """A target whose one result replaces ``a``: ``(result, status)``."""
    call = jax.ffi.ffi_call(
        target, (_like(a), _status()), input_output_aliases={0: 0}, vmap_method="sequential"
    )
    return call(a, _position(position), **attrs)


# ``n``: the global order (default ``a.shape[1]``, right on a ``1 x P`` grid). ``blocks``: ``a``
# (or the factor) is this process's block of JAX's block sharding, ``[N/cols, N/rows]``, which the
# engine redistributes to ``T_A``-square tiles with ScaLAPACK's p?gemr2d and back (results come
# back in the block too); else it is the local array of the tiled layout. ``nccl_id`` (GPUs only,
# :func:`nccl_id`) picks cuSOLVERMp's communicator. Every wrapper returns what its ``mg``
# namesake returns; status ``k > 0`` as LAPACK's info, NaN outputs then.


def potrs(
    a,
    b,
    position,
    *,
    T_A,
    grid,
    n=None,
    device_ids=None,
    moves=None,
    blocks=False,
    factor=True,
    nccl_id=None,
):
    """Cholesky factor and solve: ``(factor, x, status)``. With ``blocks``, ``factor=False``
    (the caller discards it) leaves ``A``'s block in the first output instead, which saves
    redistributing the factor back."""
    call = jax.ffi.ffi_call(
        "jaxmg_mp_potrs",
        (_like(a), _like(b), _status()),
        input_output_aliases={0: 0, 1: 1},
        vmap_method="sequential",
    )
    attrs = _attrs(T_A, n, grid, moves, a.shape[1], blocks, discard=not factor, nccl_id=nccl_id)
    return call(a, b, _position(position), **attrs)


def potri(
    a, position, *, T_A, grid, n=None, device_ids=None, moves=None, blocks=False, nccl_id=None
):
    """Inverse (lower triangle) from ``A``: ``(inverse, status)``."""
    attrs = _attrs(T_A, n, grid, moves, a.shape[1], blocks, nccl_id=nccl_id)
    return _in_place("jaxmg_mp_potri", a, position, attrs)


def syevd(
    a,
    position,
    *,
    T_A,
    grid,
    vectors=True,
    n=None,
    device_ids=None,
    moves=None,
    blocks=False,
    nccl_id=None,
):
    """Eigenvalues and vectors: ``(v, w, status)`` (ScaLAPACK always computes the vectors)."""
    width = a.shape[1] if n is None else n
    call = jax.ffi.ffi_call(
        "jaxmg_mp_syevd",
        (_like(a), jax.ShapeDtypeStruct((width,), jnp.finfo(a.dtype).dtype), _status()),
        input_output_aliases={0: 0},
        vmap_method="sequential",
    )
    return call(
        a, _position(position), vectors=bool(vectors),
        **_attrs(T_A, n, grid, moves, a.shape[1], blocks, nccl_id=nccl_id),
    )  # fmt: skip


def potrf(
    a, position, *, T_A, grid, n=None, device_ids=None, moves=None, blocks=False, nccl_id=None
):
    """Cholesky factor (lower): ``(factor, status)``."""
    attrs = _attrs(T_A, n, grid, moves, a.shape[1], blocks, nccl_id=nccl_id)
    return _in_place("jaxmg_mp_potrf", a, position, attrs)


def potrs_factored(
    factor, b, position, *, T_A, grid, n=None, device_ids=None, blocks=False, nccl_id=None
):
    """Solve with a factor of :func:`potrf`: ``(x, status)``."""
    call = jax.ffi.ffi_call(
        "jaxmg_mp_potrs_factored", (_like(b), _status()), input_output_aliases={1: 0},
        vmap_method="sequential",
    )  # fmt: skip
    attrs = _attrs(T_A, n, grid, None, factor.shape[1], blocks, nccl_id=nccl_id)
    return call(factor, b, _position(position), **attrs)


def potri_factored(
    factor, position, *, T_A, grid, n=None, device_ids=None, moves=None, blocks=False, nccl_id=None
):
    """Inverse (lower triangle) from a factor of :func:`potrf`: ``(inverse, status)``."""
    attrs = _attrs(T_A, n, grid, moves, factor.shape[1], blocks, nccl_id=nccl_id)
    return _in_place("jaxmg_mp_potri_factored", factor, position, attrs)


def getrf(
    a, position, *, T_A, grid, n=None, device_ids=None, moves=None, blocks=False, nccl_id=None
):
    """LU with partial pivoting: ``(lu, pivots, status)``, pivots ``[LLD + T_A]`` (``LLD``: the
    tiled layout's, with ``blocks`` the block's rows rounded up to whole tiles): ScaLAPACK's
    are distributed along A's rows. cuSOLVERMp's (``nccl_id``) are along its columns:
    ``[max(LLD, C) + T_A]``."""
    lld = -(-a.shape[1] // T_A) * T_A if blocks else a.shape[1]
    if nccl_id is not None:
        lld = max(lld, a.shape[0])
    call = jax.ffi.ffi_call(
        "jaxmg_mp_getrf",
        (_like(a), jax.ShapeDtypeStruct((lld + T_A,), jnp.int32), _status()),
        input_output_aliases={0: 0},
        vmap_method="sequential",
    )
    return call(
        a, _position(position), **_attrs(T_A, n, grid, moves, a.shape[1], blocks, nccl_id=nccl_id)
    )


def getrs(
    lu,
    pivots,
    b,
    position,
    *,
    T_A,
    grid,
    trans="N",
    n=None,
    device_ids=None,
    blocks=False,
    nccl_id=None,
):
    """Solve ``op(A) x = b`` with a factor of :func:`getrf`: ``(x, status)``."""
    if trans not in ("N", "T", "C"):
        raise ValueError(f"trans must be 'N', 'T' or 'C', got {trans!r}")
    call = jax.ffi.ffi_call(
        "jaxmg_mp_getrs", (_like(b), _status()), input_output_aliases={2: 0},
        vmap_method="sequential",
    )  # fmt: skip
    return call(
        lu, jnp.asarray(pivots, jnp.int32), b, _position(position), trans=np.int64(ord(trans)),
        **_attrs(T_A, n, grid, None, lu.shape[1], blocks, nccl_id=nccl_id),
    )  # fmt: skip


# The rectangular routines. On CPUs (ScaLAPACK) ``a`` is this process's block of ``A`` ([M, N])
# under JAX's block sharding over the ``(rows, cols)`` grid, transposed: ``[N/cols, M/rows]``
# (the column-major block); the engine redistributes it to ``T_A``-square tiles with p?gemr2d.
# On GPUs (cuSOLVERMp, ``nccl_id`` given; ``qr`` and ``gels`` only) ``a`` is already this
# process's local array in ``T_A``-square tiles (jaxmg_layout.BlockCyclic2D), transposed: ``[Lc,
# LLD]``, as the square routines take it: cuSOLVERMp has no p?gemr2d. The results come back
# whole on every process; with ``blocks=True``, each of ``gesvd``'s ``U`` and ``VT`` and
# ``qr``'s ``Q`` and ``R`` whose ``R_ x C_`` the grid divides (``R_`` by its rows, ``C_`` by its
# columns) comes back as ``a`` goes in: on CPUs this process's block, transposed, ``[C_/cols,
# R_/rows]`` (p?gemr2d from the routine's tiles); on GPUs its local array in ``T_A``-square
# tiles, transposed, each extent of the block rounded up to whole tiles
# (``BlockCyclic2D.padded_local_shape``), for JAX to relayout back; ``s`` whole. Status: the
# library's info (``> 0``: no convergence, or for ``gels`` an exactly singular triangular
# factor), the outputs NaN then.


def _rect_attrs(T_A, m, n, grid, nccl_id=None):
    rows, cols = (int(v) for v in grid)
    attrs = dict(
        T_A=np.int64(T_A),
        m=np.int64(m),
        n=np.int64(n),
        grid=np.asarray((rows, cols), np.int64),
        call_id=np.int64(next(_call_ids)),
    )
    if nccl_id is not None:  # the GPU engine's communicator
        attrs["nccl_id"] = np.asarray(nccl_id, np.int64).reshape(16)
    return attrs


def result_shape(rows, cols, grid, blocks, tile=None):
    """The shape a ``rows x cols`` result of :func:`gesvd` or :func:`qr` comes back in: whole,
    or with ``blocks`` where ``grid`` divides it, this process's block transposed; on GPUs
    (``tile``: the engine's ``T_A``) its local array of tiles, transposed, each extent rounded
    up to whole tiles."""
    grid_rows, grid_cols = (int(v) for v in grid)
    if blocks and rows % grid_rows == 0 and cols % grid_cols == 0:
        block_cols, block_rows = cols // grid_cols, rows // grid_rows
        if tile is None:
            return (block_cols, block_rows)
        return (-(-block_cols // tile) * tile, -(-block_rows // tile) * tile)
    return (rows, cols)


def gesvd(a, position, *, m, n, grid, T_A, blocks=False):
    """p?gesvd (``JOBU = JOBVT = 'V'``): ``(U [M, K], s [K], VT [K, N], status)``, ``K = min(M,
    N)``, ``s`` descending; ``U`` and ``VT`` in blocks with ``blocks`` (:func:`result_shape`)."""
    k = min(m, n)
    call = jax.ffi.ffi_call(
        "jaxmg_mp_gesvd",
        (
            jax.ShapeDtypeStruct(result_shape(m, k, grid, blocks), a.dtype),
            jax.ShapeDtypeStruct((k,), jnp.finfo(a.dtype).dtype),
            jax.ShapeDtypeStruct(result_shape(k, n, grid, blocks), a.dtype),
            _status(),
        ),
        vmap_method="sequential",
    )
    attrs = _rect_attrs(T_A, m, n, grid)
    return call(a, _position(position), blocks=np.int64(bool(blocks)), **attrs)


def qr(a, position, *, m, n, grid, T_A, nccl_id=None, blocks=False):
    """p?geqrf, then p?orgqr (p?ungqr), or on GPUs cusolverMpGeqrf and cusolverMpOrgqr: ``(Q
    [M, K], R [K, N], status)``, LAPACK's signs; ``Q`` and ``R`` in blocks with ``blocks``
    (:func:`result_shape`; on GPUs ``T_A`` at most the block of each sharded axis of each)."""
    k = min(m, n)
    tile = None if nccl_id is None else int(T_A)
    call = jax.ffi.ffi_call(
        "jaxmg_mp_qr",
        (
            jax.ShapeDtypeStruct(result_shape(m, k, grid, blocks, tile), a.dtype),
            jax.ShapeDtypeStruct(result_shape(k, n, grid, blocks, tile), a.dtype),
            _status(),
        ),
        vmap_method="sequential",
    )
    attrs = _rect_attrs(T_A, m, n, grid, nccl_id)
    return call(a, _position(position), blocks=np.int64(bool(blocks)), **attrs)


def gels(a, b, position, *, m, n, grid, T_A, nccl_id=None):
    """p?gels (``'N'``), ``A`` of full rank: ``(x [N, nrhs], status)`` for ``b [M, nrhs]`` (the
    same on every process): least squares for ``M >= N``, the minimum-norm solution for ``M <
    N``. On GPUs cusolverMpGels, ``M >= N`` only, one right-hand side at a time."""
    call = jax.ffi.ffi_call(
        "jaxmg_mp_gels",
        (jax.ShapeDtypeStruct((n, b.shape[1]), a.dtype), _status()),
        vmap_method="sequential",
    )
    return call(a, b, _position(position), **_rect_attrs(T_A, m, n, grid, nccl_id))
