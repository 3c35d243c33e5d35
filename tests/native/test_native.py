"""The native targets of jaxmg_cuda, called directly through jax.ffi inside shard_map.

The block-cyclic operands are built here with a small numpy loop (independent of
jaxmg_layout) and results are checked against numpy with LAPACK-style scaled residuals. The
CPU twin runs the same rendezvous as the CUDA targets, so these tests exercise the
multi-device machinery on every simulated device count. The tests on one device of their own
(lowering, call ids, imports, the cross-process error paths) run once, with 4 devices.
"""

import functools
import os
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxmg_cuda
import jaxmg_layout

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
ROWS = P("x", None)


def eps(dtype):
    return np.finfo(dtype).eps


def to_cyclic(A, ndev, tile):
    """Global [ndev*L, N] array whose row block d is device d's column-major N x L block."""
    n = A.shape[0]
    s = n // ndev
    width = -(-s // tile) * tile
    out = np.zeros((ndev * width, n), A.dtype)
    for col in range(n):
        k, offset = divmod(col, tile)
        out[(k % ndev) * width + (k // ndev) * tile + offset, :] = A[:, col]
    return out


def from_cyclic(out, n, ndev, tile, width=None):
    s = n // ndev
    width = width or -(-s // tile) * tile
    A = np.zeros((n, n), out.dtype)
    for col in range(n):
        k, offset = divmod(col, tile)
        A[:, col] = out[(k % ndev) * width + (k // ndev) * tile + offset, :]
    return A


def hermitian_pd(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        m = m + 1j * rng.standard_normal((n, n))
    return (m @ m.conj().T / n + np.eye(n)).astype(dtype)


def run(routine, A, tile, devices, b=None, vectors=True, device_ids=None):
    """One native call on ``devices``; returns host numpy outputs."""
    ids = tuple(d.id for d in devices) if device_ids is None else tuple(device_ids)
    fn, mesh = native_call(routine, tile, tuple(devices), ids, vectors)
    a = jax.device_put(to_cyclic(A, len(devices), tile), NamedSharding(mesh, ROWS))
    args = (a,) if routine != "potrs" else (a, jax.device_put(b, NamedSharding(mesh, P())))
    return [np.asarray(o) for o in fn(*args)]


@functools.cache
def native_call(routine, tile, devices, ids, vectors):
    """The jitted shard_map of one native call and its mesh, built once per configuration: jax
    then compiles it once per shape and dtype, and a test calling it again runs the same
    program (as a user's jitted function does), not a new one."""
    mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)

    def local(a, *rest):
        pos = jax.lax.axis_index("x")
        if routine == "potrs":
            return jaxmg_cuda.mg_potrs(a, rest[0], pos, T_A=tile, device_ids=list(ids))
        if routine == "potri":
            return jaxmg_cuda.mg_potri(a, pos, T_A=tile, device_ids=list(ids))
        return jaxmg_cuda.mg_syevd(a, pos, T_A=tile, device_ids=list(ids), vectors=vectors)

    # Results that are "the same on every device" come back stacked per device, so the test
    # sees every device's copy.
    per_device = P("x")
    if routine == "potrs":
        in_specs, out_specs = (ROWS, P()), (ROWS, per_device, per_device)
    elif routine == "potri":
        in_specs, out_specs = (ROWS,), (ROWS, per_device)
    else:
        in_specs, out_specs = (ROWS,), (ROWS, per_device, per_device)

    def stacked(*xs):
        outs = local(*xs)
        return tuple(o if i == 0 else o[None] for i, o in enumerate(outs))

    fn = jax.jit(
        jax.shard_map(stacked, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
    )
    return fn, mesh


def scaled_residual(A, x, b):
    n = A.shape[0]
    return np.linalg.norm(A @ x - b) / (
        np.linalg.norm(A, 1) * max(np.linalg.norm(x), 1e-300) * n * eps(A.dtype)
    )


def sizes(ndev):
    """(N, T_A) cases: a partial last tile, several tiles per device, one tile per device."""
    return [(ndev * 10, 3), (ndev * 8, 4), (ndev * 5, 5)]


@pytest.fixture(params=["cpu", "gpu"])
def devices(request):
    """The CPU twin on the simulated devices, and the cuSolverMg path on the visible GPUs. The
    GPU variants skip without a GPU."""
    if request.param == "gpu":
        return request.getfixturevalue("gpu_devices")
    return jax.devices("cpu")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_potrs(devices, dtype):
    for n, tile in sizes(len(devices)):
        A = hermitian_pd(n, dtype, seed=n)
        B = np.random.default_rng(1).standard_normal((n, 3)).astype(dtype)
        factor, x, status = run("potrs", A, tile, devices, b=np.ascontiguousarray(B.T))
        assert (status == 0).all()
        for xd in x:  # every device holds the full solution
            assert scaled_residual(A, xd.T, B) < 30
        L = np.tril(from_cyclic(factor, n, len(devices), tile))
        np.testing.assert_allclose(L, np.linalg.cholesky(A), atol=1e3 * eps(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_potri(devices, dtype):
    for n, tile in sizes(len(devices)):
        A = hermitian_pd(n, dtype, seed=n)
        inv, status = run("potri", A, tile, devices)
        assert (status == 0).all()
        lower = np.tril(from_cyclic(inv, n, len(devices), tile))
        full = lower + np.tril(lower, -1).conj().T
        r = np.linalg.norm(full @ A - np.eye(n)) / (
            np.linalg.norm(A, 1) * np.linalg.norm(full, 1) * n * eps(dtype)
        )
        assert r < 30


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("vectors", [True, False], ids=["vectors", "values"])
def test_syevd(devices, dtype, vectors):
    for n, tile in sizes(len(devices)):
        M = hermitian_pd(n, dtype, seed=n)
        A = ((M + M.conj().T) / 2 - 1.5 * np.eye(n)).astype(dtype)  # indefinite is fine
        v, w, status = run("syevd", A, tile, devices, vectors=vectors)
        assert (status == 0).all()
        expected = np.linalg.eigvalsh(
            A.astype(np.complex128 if A.dtype.kind == "c" else np.float64)
        )
        for wd in w:
            assert wd.dtype == np.finfo(dtype).dtype
            assert np.all(np.diff(wd) >= 0)
            np.testing.assert_allclose(
                wd, expected, atol=30 * n * eps(dtype) * np.abs(expected).max()
            )
        if vectors:
            V = from_cyclic(v, n, len(devices), tile)
            orth = np.linalg.norm(V.conj().T @ V - np.eye(n)) / (n * eps(dtype))
            assert orth < 30
            res = np.linalg.norm(A @ V - V * w[0]) / (np.linalg.norm(A, 1) * n * eps(dtype))
            assert res < 30


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
def test_not_positive_definite_gives_status_and_nan(devices, dtype):
    n, tile = 6 * len(devices), 2
    A = hermitian_pd(n, dtype)
    A[3, 3] = -100  # leading minor of order 4 is not positive definite
    _, x, status = run("potrs", A, tile, devices, b=np.ones((1, n), dtype))
    assert (status == 4).all()  # LAPACK's info on every device
    assert np.isnan(x).all()
    inv, status = run("potri", A, tile, devices)
    assert (status == 4).all()
    assert np.isnan(from_cyclic(inv, n, len(devices), tile)).all()


# --- the factored routines: potrf, potrs_factored, potri_factored, getrf, getrs --------------
# One jitted program per family and configuration: the factor call, then the calls that read
# its factor, so each (dtype, N, T_A) compiles once and the special matrices below reuse it.


def cyclic_rows(n, ndev, tile, width=None):
    """For each global column, its row in the stacked [ndev * L] local buffers (to_cyclic's)."""
    width = width or -(-(n // ndev) // tile) * tile
    k, offset = np.divmod(np.arange(n), tile)
    return (k % ndev) * width + (k // ndev) * tile + offset


def general(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        m = m + 1j * rng.standard_normal((n, n))
    return m.astype(dtype)


@functools.cache
def factored_program(family, tile, devices, ids):
    """``cholesky``: (a, b) -> potrf's factor and status, potrs_factored's x and status,
    potri_factored's inverse and status. ``lu``: (a, b) -> getrf's lu, pivots and status, then
    getrs's x and status (trans N: the only one cuSolverMg takes, and so the CPU twin).
    Per-device results come back stacked."""
    mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)
    kw = dict(T_A=tile, device_ids=list(ids))
    per_device = P("x")

    def cholesky(a, b):
        pos = jax.lax.axis_index("x")
        factor, s_f = jaxmg_cuda.mg_potrf(a, pos, **kw)
        x, s_x = jaxmg_cuda.mg_potrs_factored(factor, b, pos, **kw)
        inv, s_i = jaxmg_cuda.mg_potri_factored(factor, pos, **kw)
        return factor, s_f[None], x[None], s_x[None], inv, s_i[None]

    def lu(a, b):
        pos = jax.lax.axis_index("x")
        lu, piv, s_f = jaxmg_cuda.mg_getrf(a, pos, **kw)
        x, s_x = jaxmg_cuda.mg_getrs(lu, piv, b, pos, **kw)
        return lu, piv, s_f[None], x[None], s_x[None]

    if family == "cholesky":
        local, out_specs = cholesky, (ROWS, per_device, per_device, per_device, ROWS, per_device)
    else:
        local, out_specs = lu, (ROWS, per_device) + (per_device,) * 3
    fn = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=(ROWS, P()), out_specs=out_specs, check_vma=False)
    )
    return fn, mesh


def run_factored(family, A, B, tile, devices):
    """A's factor and the calls reading it, on ``devices``; ``B`` is [N, nrhs]. Returns numpy:
    the factor (and for ``lu`` the global 1-based pivots) in global column order."""
    ndev, n = len(devices), A.shape[0]
    fn, mesh = factored_program(family, tile, tuple(devices), tuple(d.id for d in devices))
    a = jax.device_put(to_cyclic(A, ndev, tile), NamedSharding(mesh, ROWS))
    b = jax.device_put(np.ascontiguousarray(B.T), NamedSharding(mesh, P()))
    outs = [np.asarray(o) for o in fn(a, b)]
    outs[0] = from_cyclic(outs[0], n, ndev, tile)
    if family == "cholesky":
        outs[4] = from_cyclic(outs[4], n, ndev, tile)
    else:
        outs[1] = outs[1][cyclic_rows(n, ndev, tile)]
    return outs


def check_solutions(op_a, xs, B, exact=True):
    """Every device's x (stacked [ndev, nrhs, N]) solves op_a x = B: a small scaled residual,
    and (``exact``) close to numpy's solution within the forward error bound."""
    dtype, n = op_a.dtype, op_a.shape[0]
    wide = op_a.astype(np.complex128 if dtype.kind == "c" else np.float64)
    reference = np.linalg.solve(wide, B)
    bound = 30 * n * eps(dtype) * np.linalg.cond(wide)
    for xd in xs:
        assert scaled_residual(op_a, xd.T, B) < 30
        if exact:
            assert np.linalg.norm(xd.T - reference) <= bound * np.linalg.norm(reference)


def check_lu(A, lu, ipiv):
    """P L U = A: ``ipiv`` (1-based) applied to A's rows in order, L unit lower, U upper."""
    n = A.shape[0]
    assert ((ipiv >= np.arange(1, n + 1)) & (ipiv <= n)).all()  # LAPACK: ipiv[i] >= i
    PA = A.copy()
    for i, p in enumerate(ipiv - 1):
        PA[[i, p]] = PA[[p, i]]
    L, U = np.tril(lu, -1) + np.eye(n, dtype=lu.dtype), np.triu(lu)
    assert np.linalg.norm(L @ U - PA) / (np.linalg.norm(A) * n * eps(A.dtype)) < 30


def rhs(n, dtype, nrhs=2):
    return np.random.default_rng(7).standard_normal((n, nrhs)).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_potrf_potrs_potri_factored(devices, dtype):
    for n, tile in sizes(len(devices)):
        A, B = hermitian_pd(n, dtype, seed=n), rhs(n, dtype)
        factor, s_f, x, s_x, inv, s_i = run_factored("cholesky", A, B, tile, devices)
        assert (s_f == 0).all() and (s_x == 0).all() and (s_i == 0).all()
        np.testing.assert_allclose(np.tril(factor), np.linalg.cholesky(A), atol=1e3 * eps(dtype))
        check_solutions(A, x, B)
        expected = np.linalg.inv(A.astype(np.complex128))
        np.testing.assert_allclose(
            np.tril(inv), np.tril(expected), atol=100 * n * eps(dtype) * np.abs(expected).max()
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_getrf_getrs(devices, dtype):
    double = np.dtype(dtype) in (np.float64, np.complex128)
    for n, tile in sizes(len(devices)):
        A, B = general(n, dtype, seed=n), rhs(n, dtype)
        lu, ipiv, s_f, x, s_x = run_factored("lu", A, B, tile, devices)
        assert (s_f == 0).all() and (s_x == 0).all()
        check_lu(A, lu, ipiv)
        if double:  # the same LAPACK on the same matrix: the same interchanges
            np.testing.assert_array_equal(ipiv, scipy.linalg.lu_factor(A)[1] + 1)
        check_solutions(A, x, B)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_getrf_getrs_pivoting_and_ill_conditioned(devices, dtype):
    """A zero leading entry (and zeros above the middle of column 0: the first pivot is a row
    of the lower half), then a matrix of condition ~1/(1000 eps): the residual stays small."""
    n, tile = sizes(len(devices))[0]
    B = rhs(n, dtype)
    A = general(n, dtype, seed=3)
    A[: n // 2, 0] = 0
    q1, _ = np.linalg.qr(general(n, dtype, seed=5))
    q2, _ = np.linalg.qr(general(n, dtype, seed=6))
    digits = -np.log10(1e3 * eps(dtype))
    ill = ((q1 * np.logspace(0, -digits, n)) @ q2).astype(dtype)
    for M, exact in ((A, True), (ill, False)):
        lu, ipiv, s_f, x, s_x = run_factored("lu", M, B, tile, devices)
        assert (s_f == 0).all() and (s_x == 0).all()
        check_lu(M, lu, ipiv)
        if M is A:
            assert ipiv[0] > n // 2
        check_solutions(M, x, B, exact=exact)


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
def test_getrf_exactly_singular_gives_status_and_nan(devices, dtype):
    """A zero column makes U's pivot there exactly zero: status is LAPACK's 1-based index of
    it (as scipy's getrf reports) on every device, and lu is NaN."""
    n, tile = sizes(len(devices))[0]
    A = general(n, dtype, seed=8)
    A[:, n - 3] = 0
    getrf = scipy.linalg.get_lapack_funcs("getrf", (A,))
    info = getrf(A)[2]
    assert info == n - 2
    lu, _, s_f, *_ = run_factored("lu", A, rhs(n, dtype), tile, devices)
    assert (s_f == info).all()
    assert np.isnan(lu).all()


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
def test_potrf_not_positive_definite_gives_status_and_nan(devices, dtype):
    n, tile = sizes(len(devices))[0]
    A = hermitian_pd(n, dtype)
    A[3, 3] = -100  # leading minor of order 4 is not positive definite
    factor, s_f, *_ = run_factored("cholesky", A, rhs(n, dtype), tile, devices)
    assert (s_f == 4).all()
    assert np.isnan(factor).all()


@pytest.mark.parametrize("dtype", [np.float64, np.complex64])
def test_factors_from_the_in_place_relayout(cpu_devices, dtype):
    """potrf and getrf given the block layout and jaxmg_layout's to_cyclic moves leave their
    factor block-cyclic in the same buffers; the solves read it there, and potri_factored
    brings the inverse back to the block layout with from_cyclic alone. N = 5 ndev, T_A = 2:
    tiles that do not divide the shard, so the blocks sit at offsets and tiles cross devices."""
    ndev = len(cpu_devices)
    n, tile = 5 * ndev, 2
    moves = jaxmg_layout.in_place_moves(jaxmg_layout.CyclicPlan.make(n, ndev, tile))
    both, back = (moves.to_cyclic, moves.from_cyclic), (None, moves.from_cyclic)
    mesh = jax.make_mesh((ndev,), ("x",), devices=cpu_devices)
    kw = dict(T_A=tile, device_ids=[d.id for d in cpu_devices])

    def local(spd, a, b):
        pos = jax.lax.axis_index("x")
        factor, s_c = jaxmg_cuda.mg_potrf(spd, pos, moves=both, **kw)
        x_c, _ = jaxmg_cuda.mg_potrs_factored(factor, b, pos, **kw)
        inv, _ = jaxmg_cuda.mg_potri_factored(factor, pos, moves=back, **kw)
        lu, piv, s_l = jaxmg_cuda.mg_getrf(a, pos, moves=both, **kw)
        x_l, _ = jaxmg_cuda.mg_getrs(lu, piv, b, pos, **kw)
        return factor, inv, lu, piv, s_c[None], s_l[None], x_c[None], x_l[None]

    fn = jax.jit(
        jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(ROWS, ROWS, P()),
            out_specs=(ROWS,) * 3 + (P("x"),) * 5,
            check_vma=False,
        )
    )
    s = n // ndev

    def blocks(M):  # device d's [W, N] buffer: its columns of M at its offset
        out = np.zeros((ndev, moves.width, n), M.dtype)
        for d, offset in enumerate(moves.offsets):
            out[d, offset : offset + s] = M[:, d * s : (d + 1) * s].T
        return jax.device_put(out.reshape(-1, n), NamedSharding(mesh, ROWS))

    A, G, B = hermitian_pd(n, dtype, seed=2), general(n, dtype, seed=2), rhs(n, dtype)
    b = jax.device_put(np.ascontiguousarray(B.T), NamedSharding(mesh, P()))
    outs = [np.asarray(o) for o in fn(blocks(A), blocks(G), b)]
    factor, inv, lu, piv, s_c, s_l, x_c, x_l = outs
    assert (s_c == 0).all() and (s_l == 0).all()
    cyclic = functools.partial(from_cyclic, n=n, ndev=ndev, tile=tile, width=moves.width)
    np.testing.assert_allclose(
        np.tril(cyclic(factor)), np.linalg.cholesky(A), atol=1e3 * eps(dtype)
    )
    check_lu(G, cyclic(lu), piv[cyclic_rows(n, ndev, tile, moves.width)])
    check_solutions(A, x_c, B)
    check_solutions(G, x_l, B)
    inv = inv.reshape(ndev, moves.width, n)
    inv = np.concatenate([inv[d, o : o + s].T for d, o in enumerate(moves.offsets)], axis=1)
    expected = np.linalg.inv(A.astype(np.complex128))
    np.testing.assert_allclose(
        np.tril(inv), np.tril(expected), atol=100 * n * eps(dtype) * np.abs(expected).max()
    )


def _misuse(cpu_devices, local, n_out):
    """Runs ``local(a, b)`` (a: [4 ndev, 4 ndev] float64 rows, b: [1, N]) under shard_map."""
    ndev = len(cpu_devices)
    mesh = jax.make_mesh((ndev,), ("x",), devices=cpu_devices)
    a = jax.device_put(to_cyclic(np.eye(4 * ndev), ndev, 2), NamedSharding(mesh, ROWS))
    b = jax.device_put(np.ones((1, 4 * ndev)), NamedSharding(mesh, P()))
    fn = jax.jit(
        jax.shard_map(
            local, mesh=mesh, in_specs=(ROWS, P()), out_specs=(P(),) * n_out, check_vma=False
        )
    )
    return jax.block_until_ready(fn(a, b))


def _raw(target, outs, aliases, *args, ndev, moves, **attrs):
    """A factored target called with relayout moves (its Python wrapper takes none)."""
    flat = np.asarray(moves, np.int64).reshape(-1)
    call = jax.ffi.ffi_call(target, outs, input_output_aliases=aliases, vmap_method="sequential")
    return call(
        *args,
        T_A=np.int64(2),
        device_ids=np.arange(ndev, dtype=np.int64),
        call_id=np.int64(next(_RAW_CALL_IDS)),
        job=np.int64(0),
        pids=np.zeros(ndev, np.int64),
        to_cyclic=flat,
        from_cyclic=np.zeros(0, np.int64),
        **attrs,
    )


_RAW_CALL_IDS = iter(range(1 << 40, 1 << 41))
MOVE = [[0, 0, 2, 2]]  # refused before the moves themselves are read
STATUS = jax.ShapeDtypeStruct((1,), jnp.int32)


@pytest.mark.parametrize("target", ["potrs_factored", "getrs", "potri_factored"])
def test_factored_calls_refuse_relayout_moves(cpu_devices, target):
    """A factor is block-cyclic already: moving its columns again would scramble it."""
    ndev = len(cpu_devices)

    def local(a, b):
        pos = jax.lax.axis_index("x")
        x = jax.ShapeDtypeStruct(b.shape, b.dtype)
        if target == "potrs_factored":
            outs = _raw(f"jaxmg_{target}", (x, STATUS), {1: 0}, a, b, pos, ndev=ndev, moves=MOVE)
        elif target == "getrs":
            piv = jnp.ones((a.shape[0],), jnp.int32)
            outs = _raw(
                f"jaxmg_{target}",
                (x, STATUS),
                {2: 0},
                a,
                piv,
                b,
                pos,
                ndev=ndev,
                moves=MOVE,
                trans=np.int64(ord("N")),
            )
        else:
            inv = jax.ShapeDtypeStruct(a.shape, a.dtype)
            outs = _raw(f"jaxmg_{target}", (inv, STATUS), {0: 0}, a, pos, ndev=ndev, moves=MOVE)
        return tuple(o[None] for o in outs)

    message = f"jaxmg_{target}: takes its factor in the block-cyclic layout"
    with pytest.raises(Exception, match=message):
        _misuse(cpu_devices, local, 2)
    assert jaxmg_cuda.open_meetings() == 0


@pytest.mark.parametrize("extra", [1, -1])
def test_getrs_refuses_wrong_pivot_shapes(cpu_devices, extra):
    ndev = len(cpu_devices)
    width = 4  # N / ndev = 4 columns a device, T_A = 2

    def local(a, b):
        pos = jax.lax.axis_index("x")
        piv = jnp.ones((width + extra,), jnp.int32)
        x, s = jaxmg_cuda.mg_getrs(a, piv, b, pos, T_A=2, device_ids=list(range(ndev)))
        return x[None], s[None]

    message = f"the pivots must be int32 \\[L={width}\\], got {width + extra} elements"
    with pytest.raises(Exception, match=message):
        _misuse(cpu_devices, local, 2)
    assert jaxmg_cuda.open_meetings() == 0


@pytest.mark.parametrize("trans", ["T", "C", "X"])
def test_getrs_refuses_all_but_trans_n(cpu_devices, trans):
    """cuSolverMg's getrs solves with A alone (an H100 answered 'T' and 'C' with info -1), and
    the CPU twin does as it does: refused in Python, and (a raw call) in the native check of
    every position, before the library."""
    ndev = len(cpu_devices)
    with pytest.raises(ValueError, match=f"mg_getrs: trans must be 'N', got '{trans}'"):
        jaxmg_cuda.mg_getrs(
            jnp.eye(2),
            jnp.ones(2, jnp.int32),
            jnp.ones((1, 2)),
            0,
            T_A=2,
            device_ids=[0],
            trans=trans,
        )

    def local(a, b):
        pos = jax.lax.axis_index("x")
        x = jax.ShapeDtypeStruct(b.shape, b.dtype)
        piv = jnp.ones((a.shape[0],), jnp.int32)
        outs = _raw(
            "jaxmg_getrs",
            (x, STATUS),
            {2: 0},
            a,
            piv,
            b,
            pos,
            ndev=ndev,
            moves=[],
            trans=np.int64(ord(trans)),
        )
        return tuple(o[None] for o in outs)

    message = f"jaxmg_getrs: trans must be 'N' \\(as its character code\\), got {ord(trans)}"
    if trans != "X":
        message += f" \\('{trans}'\\): cuSolverMg solves only with A itself"
    with pytest.raises(Exception, match=message) as raised:
        _misuse(cpu_devices, local, 2)
    assert "jaxmg.lu_solve solves with A^T or A^H" in str(raised.value)
    assert jaxmg_cuda.open_meetings() == 0


def test_handlers_run_concurrently(cpu_devices):
    """XLA runs the handlers of one call at the same time, one host thread per device: every
    participant is inside the rendezvous at once (else this call could not complete)."""
    ndev = len(cpu_devices)
    mesh = jax.make_mesh((ndev,), ("x",), devices=cpu_devices)
    ids = [d.id for d in cpu_devices]

    def local():
        return jaxmg_cuda.rendezvous_probe(jax.lax.axis_index("x"), device_ids=ids)[None]

    fn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(), out_specs=P("x"), check_vma=False))
    for _ in range(3):
        out = np.asarray(fn())
        assert out.tolist() == [[ndev, ndev]] * ndev  # ndev participants on ndev threads


def test_many_consecutive_calls(cpu_devices):
    """200 calls, each with another routine and dtype than the call before, N and T_A varying:
    all correct, no deadlock, nothing open. They cycle through 24 programs (every routine x
    dtype twice; every N / ndev in 2..5 with every T_A up to it), each compiled once and run
    again on new matrices, as a user's jitted function is."""
    ndev = len(cpu_devices)
    shapes = [(per_device, tile) for per_device in range(2, 6) for tile in range(1, per_device + 1)]
    routines = ("potrs", "potri", "syevd")
    programs = [(routines[j % 3], DTYPES[j % 4], *shapes[j % len(shapes)]) for j in range(24)]
    for i in range(200):
        routine, dtype, per_device, tile = programs[i % len(programs)]
        n = ndev * per_device
        A = hermitian_pd(n, dtype, seed=i)
        if routine == "potrs":
            b = np.ones((1, n), dtype)
            _, x, status = run("potrs", A, tile, cpu_devices, b=b)
            assert scaled_residual(A, x[0].T, b.T) < 30, i
        elif routine == "potri":
            inv, status = run("potri", A, tile, cpu_devices)
            lower = np.tril(from_cyclic(inv, n, ndev, tile))
            full = lower + np.tril(lower, -1).conj().T
            assert np.linalg.norm(full @ A - np.eye(n)) < 1e3 * n * eps(dtype), i
        else:
            _, w, status = run("syevd", A, tile, cpu_devices, vectors=False)
            np.testing.assert_allclose(w[0], np.linalg.eigvalsh(A), rtol=1e3 * eps(dtype))
        assert (status == 0).all(), i
    assert jaxmg_cuda.open_meetings() == 0


def test_many_right_hand_sides_and_one_tile(cpu_devices):
    """More right-hand sides than any chunk (300), and T_A >= N (one tile on position 0)."""
    ndev = len(cpu_devices)
    n = 4 * ndev
    A = hermitian_pd(n, np.complex128)
    B = np.random.default_rng(2).standard_normal((n, 300)).astype(np.complex128)
    for tile in (3, n):
        _, x, status = run("potrs", A, tile, cpu_devices, b=np.ascontiguousarray(B.T))
        assert (status == 0).all()
        assert scaled_residual(A, x[-1].T, B) < 30


def test_unknown_device_ids_are_fine(cpu_devices):
    """Under an abstract mesh the device ids are unknown (-1): only their count matters."""
    ndev = len(cpu_devices)
    A = hermitian_pd(4 * ndev, np.float64)
    b = np.ones((1, 4 * ndev))
    _, x, status = run("potrs", A, 2, cpu_devices, b=b, device_ids=[-1] * ndev)
    assert (status == 0).all()
    assert scaled_residual(A, x[0].T, b.T) < 30


def test_duplicate_position_errors_everywhere(cpu_devices):
    """Two participants claiming one mesh position: every device errors, nothing hangs."""
    ndev = len(cpu_devices)
    if ndev < 2:
        pytest.skip("needs at least 2 devices")
    mesh = jax.make_mesh((ndev,), ("x",), devices=cpu_devices)
    a = jax.device_put(
        to_cyclic(hermitian_pd(2 * ndev, np.float64), ndev, 2), NamedSharding(mesh, ROWS)
    )

    def local(a):
        zero = jnp.zeros((), jnp.int32)  # every participant says "position 0"
        return jaxmg_cuda.mg_potri(a, zero, T_A=2, device_ids=list(range(ndev)))

    fn = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=ROWS, out_specs=(ROWS, P()), check_vma=False)
    )
    with pytest.raises(Exception, match="two participants claim mesh position 0"):
        jax.block_until_ready(fn(a))
    assert jaxmg_cuda.open_meetings() == 0
    inv, status = run("potri", hermitian_pd(2 * ndev, np.float64), 2, cpu_devices)
    assert (status == 0).all()


FAULT_SCRIPT = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {here!r})
    import jax
    jax.config.update("jax_num_cpu_devices", {ndev})
    import numpy as np
    import test_native as t
    devices = jax.devices("cpu")
    A = t.hermitian_pd(4 * len(devices), np.float64)
    start = time.monotonic()
    try:
        # One more participant than devices: the call can never gather everyone.
        t.run("potrs", A, 2, devices, b=np.ones((1, A.shape[0])),
              device_ids=[d.id for d in devices] + [99])
    except Exception as err:
        print("FAILED-AS-EXPECTED", round(time.monotonic() - start, 1), str(err)[:2000])
    else:
        print("NO-ERROR")
    _, x, status = t.run("potrs", A, 2, devices, b=np.ones((1, A.shape[0])))
    print("NEXT-CALL", int(status.max()), bool(np.isfinite(x).all()))
    import jaxmg_cuda
    print("OPEN", jaxmg_cuda.open_meetings())
    """
)


def test_missing_participant_fails_everyone_within_deadline(cpu_devices):
    script = FAULT_SCRIPT.format(here=os.path.dirname(__file__), ndev=len(cpu_devices))
    env = dict(os.environ, JAXMG_TIMEOUT_S="2")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    out = done.stdout
    assert "FAILED-AS-EXPECTED" in out, out + done.stderr
    assert "timed out after 2 s" in out
    assert f"{len(cpu_devices)} of {len(cpu_devices) + 1} arrived" in out
    seconds = float(out.split("FAILED-AS-EXPECTED")[1].split()[0])
    assert seconds < 30
    assert "NEXT-CALL 0 True" in out
    assert "OPEN 0" in out


def test_bad_operand_reaches_every_participant(cpu_devices):
    """A malformed call (T_A not dividing the local width) errors on every device, no hang."""
    ndev = len(cpu_devices)
    mesh = jax.make_mesh((ndev,), ("x",), devices=cpu_devices)
    a = jax.device_put(np.eye(5 * ndev, dtype=np.float64)[: 5 * ndev], NamedSharding(mesh, ROWS))

    def local(a):
        return jaxmg_cuda.mg_potri(a, jax.lax.axis_index("x"), T_A=2, device_ids=list(range(ndev)))

    fn = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=ROWS, out_specs=(ROWS, P()), check_vma=False)
    )
    with pytest.raises(Exception, match="not a multiple of T_A=2"):
        jax.block_until_ready(fn(a))
    assert jaxmg_cuda.open_meetings() == 0


@pytest.mark.parametrize(
    "moves, message",
    [
        ([[0, 3, 0, 2]], "move 0 \\(0, 3, 0, 2\\) is out of round order or not a column"),
        ([[0, 0, 1, 2]], "to a disjoint one"),  # overlaps its own source
        ([[0, 0, 2, 0]], "not a column range"),  # empty
        ([[1, 0, 2, 1], [0, 2, 0, 1]], "move 1 .* out of round order"),
        ([[0, 1]], "to_cyclic must be \\(round, source, destination, width\\) rows"),  # Python
    ],
)
def test_bad_moves_reach_every_participant(cpu_devices, moves, message):
    """Relayout moves the native executor must not run are refused by name, on every device."""
    ndev = len(cpu_devices)
    mesh = jax.make_mesh((ndev,), ("x",), devices=cpu_devices)
    a = jax.device_put(np.eye(4 * ndev, dtype=np.float64), NamedSharding(mesh, ROWS))
    flat = np.asarray(moves, np.int64).reshape(-1)

    def local(a):
        return jaxmg_cuda.mg_potri(
            a, jax.lax.axis_index("x"), T_A=2, device_ids=list(range(ndev)), moves=(flat, None)
        )

    fn = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=ROWS, out_specs=(ROWS, P()), check_vma=False)
    )
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(fn(a))
    assert jaxmg_cuda.open_meetings() == 0


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.parametrize("routine", ["potrs", "potri", "syevd"])
def test_cuda_lowering_on_cpu(cpu_devices, routine):
    """Lowered for CUDA (on a machine without a GPU), each call names our custom call with its
    attributes and the aliasing of ``a`` (and ``b``) into the results."""
    mesh = jax.make_mesh((1,), ("x",), devices=cpu_devices[:1])
    a = jax.device_put(jnp.zeros((8, 8), jnp.complex64), NamedSharding(mesh, ROWS))
    b = jax.device_put(jnp.zeros((1, 8), jnp.complex64), NamedSharding(mesh, P()))

    def local(a, b):
        pos = jax.lax.axis_index("x")
        if routine == "potrs":
            return jaxmg_cuda.mg_potrs(a, b, pos, T_A=4, device_ids=[0])
        if routine == "potri":
            return jaxmg_cuda.mg_potri(a, pos, T_A=4, device_ids=[0])
        return jaxmg_cuda.mg_syevd(a, pos, T_A=4, device_ids=[0], vectors=False)

    n_out = {"potrs": 3, "potri": 2, "syevd": 3}[routine]
    fn = jax.jit(
        jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(ROWS, P()),
            out_specs=(ROWS,) + (P(),) * (n_out - 1),
            check_vma=False,
        )
    )
    text = fn.trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    assert f"custom_call @jaxmg_{routine}(" in text
    assert "T_A = 4 : i64" in text
    assert "call_id = " in text
    assert "device_ids = dense<0> : tensor<1xi64>" in text
    assert "output_operand_aliases" in text
    if routine == "potrs":
        assert "output_tuple_indices = [1], operand_index = 1" in text
    if routine == "syevd":
        assert "vectors = false" in text
        assert "tensor<8xf32>" in text  # w has the real dtype


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.parametrize("routine", ["potrs", "getrf", "syevd"])
def test_mp_cuda_lowering_on_cpu(cpu_devices, routine):
    """Backend "mp" lowered for CUDA: the same jaxmg_mp_* target as on CPUs, with the grid and
    the NCCL communicator's id (16 int64) as attributes, and ``a`` aliased into the result."""
    mesh = jax.make_mesh((1,), ("x",), devices=cpu_devices[:1])
    a = jax.device_put(jnp.zeros((8, 8), jnp.float32), NamedSharding(mesh, ROWS))
    b = jax.device_put(jnp.zeros((1, 8), jnp.float32), NamedSharding(mesh, P()))
    nccl_id = np.arange(16, dtype=np.int64) + 1000
    common = dict(T_A=4, grid=(1, 1), nccl_id=nccl_id)

    def local(a, b):
        pos = jax.lax.axis_index("x")
        if routine == "potrs":
            return jaxmg_cuda.mp.potrs(a, b, pos, **common)
        if routine == "getrf":
            return jaxmg_cuda.mp.getrf(a, pos, **common)
        return jaxmg_cuda.mp.syevd(a, pos, **common)

    fn = jax.jit(
        jax.shard_map(
            local, mesh=mesh, in_specs=(ROWS, P()), out_specs=(ROWS, P(), P()), check_vma=False
        )
    )
    text = fn.trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    assert f"custom_call @jaxmg_mp_{routine}(" in text
    assert "grid = dense<1> : tensor<2xi64>" in text
    words = ", ".join(str(v) for v in nccl_id)
    assert f"nccl_id = dense<[{words}]> : tensor<16xi64>" in text
    assert "output_operand_aliases" in text
    cpu_text = fn.trace(a, b).lower(lowering_platforms=("cpu",)).as_text()
    assert "nccl_id" in cpu_text  # the wrapper decides; the CPU engine would refuse it at run
    with pytest.raises(ValueError, match="on GPUs takes no blocks"):
        jaxmg_cuda.mp.potrf(a, 0, T_A=4, grid=(1, 1), blocks=True, nccl_id=nccl_id)


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.parametrize("routine", ["qr", "gels"])
def test_mp_cuda_rectangular_lowering_on_cpu(cpu_devices, routine):
    """The rectangular routines lowered for CUDA: the same jaxmg_mp_* target as on CPUs, with
    M, N, the grid and the NCCL communicator's id as attributes and the results' shapes."""
    mesh = jax.make_mesh((1,), ("x",), devices=cpu_devices[:1])
    a = jax.device_put(jnp.zeros((6, 10), jnp.float64), NamedSharding(mesh, ROWS))
    b = jax.device_put(jnp.zeros((10, 2), jnp.float64), NamedSharding(mesh, P()))
    nccl_id = np.arange(16, dtype=np.int64) + 2000
    common = dict(m=10, n=6, T_A=2, grid=(1, 1), nccl_id=nccl_id)

    def local(a, b):
        pos = jax.lax.axis_index("x")
        if routine == "qr":
            return jaxmg_cuda.mp.qr(a, pos, **common)
        return jaxmg_cuda.mp.gels(a, b, pos, **common)

    outs = (P(), P(), P()) if routine == "qr" else (P(), P())
    fn = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=(ROWS, P()), out_specs=outs, check_vma=False)
    )
    text = fn.trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    assert f"custom_call @jaxmg_mp_{routine}(" in text
    words = ", ".join(str(v) for v in nccl_id)
    assert f"nccl_id = dense<[{words}]> : tensor<16xi64>" in text
    assert "m = 10 : i64" in text and "n = 6 : i64" in text
    results = ("tensor<10x6xf64>", "tensor<6x6xf64>") if routine == "qr" else ("tensor<6x2xf64>",)
    assert all(r in text for r in results), text
    if routine == "qr":  # in blocks: the local arrays of 4-square tiles, each extent rounded up
        blocked = dict(common, T_A=4, blocks=True)
        fn = jax.jit(
            jax.shard_map(
                lambda a: jaxmg_cuda.mp.qr(a, jax.lax.axis_index("x"), **blocked),
                mesh=mesh,
                in_specs=ROWS,
                out_specs=(P(), P(), P()),
                check_vma=False,
            )
        )
        text = fn.trace(a).lower(lowering_platforms=("cuda",)).as_text()
        assert "blocks = 1 : i64" in text
        assert "tensor<8x12xf64>" in text and "tensor<8x8xf64>" in text, text  # Q^T, R^T


_MP_GPU_SCRIPT = """
import os, sys
import numpy as np
import jaxmg_cuda
from jaxmg.engines import ENGINES
if sys.argv[1] != "-":
    jaxmg_cuda._jaxmg_cuda.set_cuda_library_dirs([sys.argv[1]])
try:
    ENGINES["mp"].load("jaxmg.potrs", "gpu")
except (NotImplementedError, RuntimeError) as error:
    print(type(error).__name__, error)
    raise SystemExit(0)
engine = ENGINES["mp"].routines("gpu", "jaxmg.lu_solve")
print("ID", np.asarray(engine.potrs.keywords["nccl_id"]).shape, engine.potrs.func.__name__)
for call in (lambda: engine.potri(None, 0), lambda: engine.getrs(None, None, None, 0, trans="T")):
    try:
        call()
    except NotImplementedError as error:
        print("REFUSED", error)
"""


@pytest.mark.usefixtures("once_per_suite")
def test_mp_on_gpus_is_opt_in_and_refuses_what_cusolvermp_lacks(fake_cuda):
    """Backend "mp" on GPUs has not run on hardware: without JAXMG_GPU_MULTIPROCESS=1 it is
    refused before any work; with it, a machine without NCCL and cuSOLVERMp gets the wheels to
    install; with them (the emulator), the wrappers carry the job's NCCL id (made by
    ncclGetUniqueId) and refuse the inverse and transposed solves at trace time, naming the way
    out. Each in a process of its own: the libraries are opened once per process."""
    if not jaxmg_cuda.has_cuda_support():
        pytest.skip("jaxmg_cuda was built without CUDA support")
    pytest.importorskip("jaxmg", reason="calls jaxmg (nox -s tsan installs jaxmg-cuda alone)")

    def run(folder, opt_in):
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        env.pop("JAXMG_GPU_MULTIPROCESS", None)
        if opt_in:
            env["JAXMG_GPU_MULTIPROCESS"] = "1"
        done = subprocess.run(
            [sys.executable, "-c", _MP_GPU_SCRIPT, folder],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    out = run(str(fake_cuda), opt_in=False)
    assert out.startswith("NotImplementedError jaxmg.potrs: backend='mp' on GPUs"), out
    assert (
        "has run on one GPU but not yet on several" in out and "JAXMG_GPU_MULTIPROCESS=1" in out
    ), out
    if jaxmg_cuda.load_cuda_libraries() != "":  # no CUDA libraries here: the message says what
        out = run("-", opt_in=True)
        assert out.startswith("RuntimeError jaxmg.potrs: ") and "pip install" in out, out
    out = run(str(fake_cuda), opt_in=True)
    assert "ID (16,) potrs" in out, out
    refused = [line for line in out.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 2, out
    assert "has no inverse (potri" in refused[0], out
    assert "has no solve with A^T or A^H" in refused[1], out


@pytest.mark.usefixtures("once_per_suite")
def test_distinct_calls_get_distinct_call_ids(cpu_devices):
    """Two calls in one program never meet: each traced call carries a new call_id."""
    mesh = jax.make_mesh((1,), ("x",), devices=cpu_devices[:1])
    a = jax.device_put(jnp.zeros((4, 4), jnp.float64), NamedSharding(mesh, ROWS))

    def local(a):
        pos = jax.lax.axis_index("x")
        inv, s1 = jaxmg_cuda.mg_potri(a, pos, T_A=2, device_ids=[0])
        _, w, s2 = jaxmg_cuda.mg_syevd(inv, pos, T_A=2, device_ids=[0])
        return w, s1, s2

    fn = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=ROWS, out_specs=(P(),) * 3, check_vma=False)
    )
    text = fn.trace(a).lower(lowering_platforms=("cpu",)).as_text()
    ids = [
        line.split("call_id = ")[1].split(" ")[0] for line in text.splitlines() if "call_id" in line
    ]
    assert len(ids) == 2 and ids[0] != ids[1]


@pytest.mark.usefixtures("once_per_suite")
def test_import_loads_no_cuda_library():
    """Importing jaxmg_cuda registers the targets but opens no CUDA library."""
    script = (
        "import jaxmg_cuda, pathlib\n"
        "maps = pathlib.Path('/proc/self/maps').read_text()\n"
        "print('LOADED' if ('libcusolverMg' in maps or 'libcudart' in maps) else 'CLEAN')\n"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "CLEAN", done.stdout + done.stderr


@pytest.mark.usefixtures("once_per_suite")
def test_cuda_libraries_load_or_explain():
    """Opening the libraries on request works, or says what was looked for and where."""
    if not jaxmg_cuda.has_cuda_support():
        pytest.skip("jaxmg_cuda was built without CUDA support")
    message = jaxmg_cuda.load_cuda_libraries()
    assert message == "" or ("libcusolverMg" in message and "LD_LIBRARY_PATH" in message)


@pytest.mark.usefixtures("once_per_suite")
def test_has_cuda_support_reports_the_build():
    assert isinstance(jaxmg_cuda.has_cuda_support(), bool)


# --- the multi-process protocol, seen from one process ----------------------------------------
# Full jobs of 2 and 4 processes run in tests/multiprocess; these cover its error paths with a
# single participant in this process and the peer's pid chosen by the test.


def _dead_pid():
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


JOB = 0x5EED


def _shm_ours():
    """The segments of JOB, the job of these tests (other processes may hold others)."""
    prefix = f"jaxmg-{os.geteuid()}-{JOB:016x}-"
    return {p for p in os.listdir("/dev/shm") if p.startswith(prefix)}


def _one_of_two(position, pids, job=JOB):
    """Mesh position ``position`` of a 2-process potrs, run here on one CPU device."""
    n, tile = 8, 2
    block = to_cyclic(hermitian_pd(n, np.float64), 2, tile).reshape(2, -1, n)[position]
    fn = jax.jit(
        lambda a, b: jaxmg_cuda.mg_potrs(
            a, b, position, T_A=tile, device_ids=[0, 1], job=job, pids=pids
        )
    )
    return jax.block_until_ready(fn(jnp.asarray(block), jnp.ones((1, n))))


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no POSIX shared memory")
@pytest.mark.parametrize("position", [0, 1])
def test_cross_process_peer_that_is_gone(position, monkeypatch):
    """The peer's process does not exist: the call fails at once, naming it, and removes its
    shared memory (the deadline would be 60 s)."""
    monkeypatch.setenv("JAXMG_TIMEOUT_S", "60")
    before = _shm_ours()
    dead = _dead_pid()
    pids = [os.getpid(), dead] if position == 0 else [dead, os.getpid()]
    start = time.monotonic()
    with pytest.raises(
        Exception, match=f"mesh position {1 - position} \\(process {dead}\\).*exited"
    ):
        _one_of_two(position, pids)
    assert time.monotonic() - start < 10
    assert _shm_ours() == before


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no POSIX shared memory")
@pytest.mark.parametrize("position", [0, 1])
def test_cross_process_peer_that_never_comes(position, monkeypatch):
    """The peer's process lives (our parent) but never joins: the deadline names it."""
    monkeypatch.setenv("JAXMG_TIMEOUT_S", "1")
    before = _shm_ours()
    other = os.getppid()
    pids = [os.getpid(), other] if position == 0 else [other, os.getpid()]
    with pytest.raises(Exception, match=f"timed out after 1 s.*mesh position {1 - position}"):
        _one_of_two(position, pids)
    assert _shm_ours() == before


@pytest.mark.usefixtures("once_per_suite")
def test_cross_process_position_of_another_process():
    """A process that claims a mesh position whose pid is not its own is refused."""
    with pytest.raises(Exception, match="belongs to process 1, not to this one"):
        _one_of_two(1, [os.getpid(), 1])
