"""Python wrappers of the FFI targets, and their registration (once, at import)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from . import _jaxmg_cuda, _libraries

# A new id per traced call: the handlers of one call meet under (device ids, call id), so
# two calls in one program never meet each other. The HLO instructions one traced call may
# become (a jitted function called twice in one program) are told apart at run time by their
# instance (csrc/ffi/instance.h).
_call_ids = itertools.count(1)


def _register_lapack() -> None:
    from scipy.linalg.cython_lapack import __pyx_capi__ as capsules

    names = [f"{p}{r}" for p in "sdcz" for r in ("potrf", "potrs", "potri", "getrf", "getrs")]
    names += ["ssyevd", "dsyevd", "cheevd", "zheevd"]
    for name in names:
        _jaxmg_cuda.register_lapack(name, capsules[name])


def _register_targets() -> None:
    # The state type first: a CPU target's instantiate stage makes one (csrc/ffi/instance.h).
    for name, registration in _jaxmg_cuda.state_types().items():
        jax.ffi.register_ffi_type(name, registration, platform="cpu")
    # Each target: {stage: capsule}, its instantiate (CPU only) and execute stages.
    for name, stages in _jaxmg_cuda.cpu_targets().items():
        jax.ffi.register_ffi_target(name, stages, platform="cpu")
    for name, stages in _jaxmg_cuda.cuda_targets().items():
        jax.ffi.register_ffi_target(name, stages, platform="CUDA")
    if _jaxmg_cuda.has_cuda():
        _jaxmg_cuda.set_cuda_library_dirs(_libraries.candidate_dirs())


_register_lapack()
_register_targets()


def has_cuda_support() -> bool:
    """Whether this build contains the cuSolverMg targets (the CUDA libraries themselves are
    looked for only when a GPU call runs)."""
    return bool(_jaxmg_cuda.has_cuda())


def load_cuda_libraries() -> str:
    """Open libcudart and libcusolverMg now instead of at the first GPU call; returns ``""``
    on success, else a message saying what was looked for and where."""
    return str(_jaxmg_cuda.load_cuda_libraries())


def open_meetings() -> int:
    """Calls whose participants are still gathering (0 between calls; for tests)."""
    return int(_jaxmg_cuda.open_meetings())


def _moves(moves, name):
    flat = np.zeros(0, np.int64) if moves is None else np.asarray(moves, np.int64).reshape(-1)
    if flat.size % 4:
        raise ValueError(
            f"{name} must be (round, source, destination, width) rows, got {flat.size} values"
        )
    return flat


def _attrs(T_A, device_ids, job, pids, moves):
    ids = np.asarray(device_ids, dtype=np.int64).reshape(-1)
    pids = np.zeros_like(ids) if pids is None else np.asarray(pids, dtype=np.int64).reshape(-1)
    if job and pids.shape != ids.shape:
        raise ValueError(f"pids must name the process of each of the {ids.size} mesh positions")
    to_cyclic, from_cyclic = (None, None) if moves is None else moves
    return dict(
        T_A=np.int64(T_A),
        device_ids=ids,
        call_id=np.int64(next(_call_ids)),
        job=np.int64(job),
        pids=pids,
        to_cyclic=_moves(to_cyclic, "to_cyclic"),
        from_cyclic=_moves(from_cyclic, "from_cyclic"),
    )


def rendezvous_probe(position, *, device_ids):
    """Diagnostics (CPU): every participant meets; returns int32 ``[participants, threads]``,
    the distinct host threads XLA used for this call's handlers."""
    call = jax.ffi.ffi_call(
        "jaxmg_probe", jax.ShapeDtypeStruct((2,), jnp.int32), vmap_method="sequential"
    )
    return call(
        jnp.asarray(position, jnp.int32),
        device_ids=np.asarray(device_ids, dtype=np.int64).reshape(-1),
        call_id=np.int64(next(_call_ids)),
    )


def _status():
    return jax.ShapeDtypeStruct((1,), jnp.int32)


def _like(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype)


def mg_potrs(a, b, position, *, T_A, device_ids, job=0, pids=None, moves=None):
    """Cholesky solve on local block-cyclic shards; returns ``(factor, x, status)``.

    ``a``: ``[L, N]`` local shard (column-major ``N x L``, tile ``T_A``); ``b``: ``[nrhs, N]``,
    the same on every device; ``position``: this device's index on the mesh axis. ``x`` is
    the full solution on every device; NaN where ``status != 0``.

    Multi-process mode (one device per process, one host; on GPUs through CUDA IPC): ``job`` is
    a nonzero token every process of the job agreed on, ``pids`` the process id of each mesh
    position.
    The default ``job=0`` means every participant runs in this process.

    In-place relayout: with ``moves = (to_cyclic, from_cyclic)`` (e.g. the two tables of
    ``jaxmg_layout.in_place_moves``: ``[m, 4]`` column-range moves) ``a`` is in the caller's
    block layout instead; the leader permutes it to the block-cyclic layout, in place,
    before the library runs. potrs leaves its factor in the block-cyclic layout; potri and
    syevd bring their result back with ``from_cyclic``.
    """
    call = jax.ffi.ffi_call(
        "jaxmg_potrs",
        (_like(a), _like(b), _status()),
        input_output_aliases={0: 0, 1: 1},
        vmap_method="sequential",
    )
    return call(a, b, jnp.asarray(position, jnp.int32), **_attrs(T_A, device_ids, job, pids, moves))


def mg_potri(a, position, *, T_A, device_ids, job=0, pids=None, moves=None):
    """Inverse from the Cholesky factor; returns ``(a_inv, status)``: the lower triangle of
    the inverse in the same layout (upper triangle unspecified), NaN where ``status != 0``.
    ``job``, ``pids``, ``moves``: as for :func:`mg_potrs`."""
    call = jax.ffi.ffi_call(
        "jaxmg_potri",
        (_like(a), _status()),
        input_output_aliases={0: 0},
        vmap_method="sequential",
    )
    return call(a, jnp.asarray(position, jnp.int32), **_attrs(T_A, device_ids, job, pids, moves))


def mg_syevd(a, position, *, T_A, device_ids, vectors=True, job=0, pids=None, moves=None):
    """Hermitian eigensolver; returns ``(v, w, status)``: eigenvectors overwrite the shard
    (unspecified when ``vectors=False``), ``w`` the ascending eigenvalues on every device.
    ``job``, ``pids``, ``moves``: as for :func:`mg_potrs`."""
    real = jnp.finfo(a.dtype).dtype
    call = jax.ffi.ffi_call(
        "jaxmg_syevd",
        (_like(a), jax.ShapeDtypeStruct((a.shape[1],), real), _status()),
        input_output_aliases={0: 0},
        vmap_method="sequential",
    )
    return call(
        a,
        jnp.asarray(position, jnp.int32),
        vectors=bool(vectors),
        **_attrs(T_A, device_ids, job, pids, moves),
    )


def mg_potrf(a, position, *, T_A, device_ids, job=0, pids=None, moves=None):
    """Cholesky factor alone; returns ``(factor, status)``: the lower triangle ``L`` of
    ``A = L L^H`` in the block-cyclic layout (upper triangle unspecified; with ``moves``, only
    ``to_cyclic`` is used: the factor stays cyclic), NaN where ``status != 0``. Arguments as
    for :func:`mg_potrs`."""
    call = jax.ffi.ffi_call(
        "jaxmg_potrf", (_like(a), _status()), input_output_aliases={0: 0}, vmap_method="sequential"
    )
    return call(a, jnp.asarray(position, jnp.int32), **_attrs(T_A, device_ids, job, pids, moves))


def mg_potrs_factored(factor, b, position, *, T_A, device_ids, job=0, pids=None):
    """Solve with a factor of :func:`mg_potrf` (read only, block-cyclic); returns
    ``(x, status)``, ``x`` ``[nrhs, N]`` the same on every device."""
    call = jax.ffi.ffi_call(
        "jaxmg_potrs_factored",
        (_like(b), _status()),
        input_output_aliases={1: 0},
        vmap_method="sequential",
    )
    return call(
        factor, b, jnp.asarray(position, jnp.int32), **_attrs(T_A, device_ids, job, pids, None)
    )


def mg_potri_factored(factor, position, *, T_A, device_ids, job=0, pids=None, moves=None):
    """Inverse from a factor of :func:`mg_potrf`; returns ``(a_inv, status)``: the lower
    triangle of the inverse, block-cyclic (with ``moves``, ``from_cyclic`` brings it back to the
    caller's layout; ``to_cyclic`` must be empty: the factor is cyclic already)."""
    call = jax.ffi.ffi_call(
        "jaxmg_potri_factored",
        (_like(factor), _status()),
        input_output_aliases={0: 0},
        vmap_method="sequential",
    )
    return call(
        factor, jnp.asarray(position, jnp.int32), **_attrs(T_A, device_ids, job, pids, moves)
    )


def mg_getrf(a, position, *, T_A, device_ids, job=0, pids=None, moves=None):
    """LU factor with partial pivoting; returns ``(lu, pivots, status)``: ``L`` (unit lower) and
    ``U`` in the block-cyclic layout, ``pivots`` int32 ``[L]`` of this device's local columns
    (1-based global rows, LAPACK's ipiv), ``status`` ``k > 0`` when ``U[k-1, k-1]`` is exactly
    zero (``lu`` is then NaN). Arguments as for :func:`mg_potrf`."""
    call = jax.ffi.ffi_call(
        "jaxmg_getrf",
        (_like(a), jax.ShapeDtypeStruct((a.shape[0],), jnp.int32), _status()),
        input_output_aliases={0: 0},
        vmap_method="sequential",
    )
    return call(a, jnp.asarray(position, jnp.int32), **_attrs(T_A, device_ids, job, pids, moves))


def mg_getrs(lu, pivots, b, position, *, T_A, device_ids, trans="N", job=0, pids=None):
    """Solve ``A x = b`` with a factor of :func:`mg_getrf` (read only). Returns ``(x, status)``,
    ``x`` ``[nrhs, N]`` the same on every device.

    ``trans`` must be ``"N"``: cuSolverMg's getrs solves only with ``A`` itself (an H100
    answered ``"T"`` and ``"C"`` with info -1), and the CPU twin refuses what it refuses.
    ``jaxmg.lu_solve`` solves with ``A^T`` or ``A^H`` through a factor of the transpose."""
    if trans != "N":
        raise ValueError(
            f"mg_getrs: trans must be 'N', got {trans!r}: cuSolverMg solves only with A itself "
            "(its getrs refuses A^T and A^H); jaxmg.lu_solve solves with A^T or A^H "
            "(trans=1, 2) through a factor of the transpose"
        )
    call = jax.ffi.ffi_call(
        "jaxmg_getrs",
        (_like(b), _status()),
        input_output_aliases={2: 0},
        vmap_method="sequential",
    )
    return call(
        lu,
        jnp.asarray(pivots, jnp.int32),
        b,
        jnp.asarray(position, jnp.int32),
        trans=np.int64(ord(trans)),
        **_attrs(T_A, device_ids, job, pids, None),
    )
