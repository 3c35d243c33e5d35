"""One meaning of the status on every backend (docs/sharp-bits.md, "Status codes").

LAPACK's ``info`` of ``A`` itself (scipy's ``?potrf`` and ``?getrf`` on the same matrix are the
reference): the order of the first leading minor that is not positive definite (``potrs``,
``potri``, ``cho_factor``), the first exact zero of ``U``'s diagonal (``lu_factor``); and
``N + 1`` where ``A`` holds NaN or Inf, for every routine. Every floating output is NaN where
the status is not 0. Checked on backend ``"mg"`` (the LAPACK twin), ``"jax"`` on several devices
(the engine of collectives, which factors a permutation of ``A`` where its own tile is
narrower than the layout's, and reports LAPACK's ``info`` in that order: the ``k`` below are
chosen so that its order fails elsewhere than ``A``'s) and on one device (JAX's dense
solvers), on every device and on two of them.
Backend ``"mp"``: tests/mpi (jax_worker.py's status case).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from jax.sharding import Mesh
from matrices import FORMS, hpd, put, random

import jaxmg
from jaxmg.engines.collectives import _inner, _rows


def _mesh(ndev):
    if jax.device_count() < ndev:
        pytest.skip(f"needs {ndev} devices")
    return Mesh(np.asarray(jax.devices()[:ndev]), ("x",))


#: (backend, devices, form): the LAPACK twin, the engine of collectives, JAX's one-device
#: solvers; each in one form (the forms differ above the engines only).
PLACES = [
    pytest.param(("mg", "all", "cols"), id="mg"),
    pytest.param(("jax", "all", "rows"), id="jax"),
    pytest.param(("jax", 1, "rows"), id="jax-1"),
]
#: And the engine of collectives on two devices, whose order of ``A`` differs again.
ORDERS = [*PLACES, pytest.param(("jax", 2, "cols"), id="jax-2", marks=pytest.mark.grid_sweep)]


def _place(param):
    backend, ndev, form = param
    ndev = jax.device_count() if ndev == "all" else ndev
    if backend == "jax" and ndev > 1 and jax.device_count() == 1:
        pytest.skip("the engine of collectives runs on several devices")
    return backend, _mesh(ndev), FORMS[form]


@pytest.fixture(params=PLACES)
def place(request):
    return _place(request.param)


@pytest.fixture(params=ORDERS)
def ordered(request):
    return _place(request.param)


def _n(mesh):
    """16 rows per device (at least 32): the engine of collectives then steps through tiles of
    a quarter of a device's columns, so its order is not ``A``'s."""
    return max(16 * mesh.size, 32)


def _nan(x):
    return bool(np.isnan(np.asarray(x)).all())


def _potrf_info(a):
    potrf = scipy.linalg.lapack.zpotrf if np.iscomplexobj(a) else scipy.linalg.lapack.dpotrf
    return int(potrf(a, lower=1)[1])


def _getrf_info(a):
    getrf = scipy.linalg.lapack.zgetrf if np.iscomplexobj(a) else scipy.linalg.lapack.dgetrf
    return int(getrf(a)[2])


def _engine_order(n, ndev):
    """The rows (columns) of ``A`` in the engine of collectives' order, at its default tile."""
    return _rows(n, ndev, n // ndev, _inner(n // ndev, n, ndev))


def _engine_info(a, ndev):
    """LAPACK's ``info`` of the engine of collectives' permutation of ``A`` (its own order)."""
    rows = _engine_order(a.shape[0], ndev)
    return _potrf_info(a[np.ix_(rows, rows)])


def _hermitian_routines(a, mesh, backend, spec, T_A=None):
    """``{routine: (status, [outputs])}`` of every Hermitian routine on ``a``."""
    n = a.shape[0]
    A = put(a, mesh, spec)
    b = jnp.ones((n, 2), a.dtype)
    x, st_x = jaxmg.potrs(A, b, T_A, backend=backend, return_status=True)
    inv, st_inv = jaxmg.potri(A, T_A, backend=backend, return_status=True)
    factor = jaxmg.cho_factor(A, T_A, backend=backend)
    solved = jaxmg.cho_solve(factor, b)
    return {
        "potrs": (st_x, [x]),
        "potri": (st_inv, [inv]),
        "cho_factor": (factor.status, [factor.factor, solved]),
    }


def _eigen_routines(a, mesh, backend, spec):
    A = put(a, mesh, spec)
    w, v, st = jaxmg.syevd(A, backend=backend, return_status=True)
    w_only, st_only = jaxmg.syevd(A, return_eigenvectors=False, backend=backend, return_status=True)
    return {"syevd": (st, [w, v]), "syevd values": (st_only, [w_only])}


def _lu_routines(a, mesh, backend, spec, T_A=None):
    lu = jaxmg.lu_factor(put(a, mesh, spec), T_A, backend=backend)
    x = jaxmg.lu_solve(lu, jnp.ones(a.shape[0], a.dtype))
    return {"lu_factor": (lu.status, [lu.factor, x])}


def _check(results, expected):
    for routine, (status, outputs) in results.items():
        assert int(status) == expected, routine
        if expected:
            assert all(_nan(o) for o in outputs), routine
        else:
            assert not any(np.isnan(np.asarray(o)).any() for o in outputs), routine


def _non_finite(n, dtype, value, where):
    a = hpd(n, dtype, seed=3)
    i, j = where
    a[i, j] = value
    a[j, i] = np.conj(value)
    return a


def test_nan_or_inf_in_a_is_n_plus_1_and_nan_everywhere(place):
    """A NaN off the diagonal, an Inf on it, one entry in the first and one in the last
    device's block: status ``N + 1`` from every routine (LAPACK itself reports none here: it
    runs on, or stops at an order of its own), every output NaN; a finite ``A`` right after
    gives 0 from the same programs."""
    backend, mesh, spec = place
    n, dtype = _n(mesh), np.float64
    cases = [(np.nan, (5, 1)), (np.inf, (n - 3, n - 3)), (-np.inf, (n - 1, 0))]
    for value, where in cases:
        a = _non_finite(n, dtype, value, where)
        _check(_hermitian_routines(a, mesh, backend, spec), n + 1)
        _check(_eigen_routines(a, mesh, backend, spec), n + 1)
        _check(_lu_routines(a, mesh, backend, spec), n + 1)
    a = hpd(n, dtype, seed=3)
    _check(_hermitian_routines(a, mesh, backend, spec), 0)
    _check(_lu_routines(a, mesh, backend, spec), 0)


def test_not_positive_definite_is_lapacks_info(ordered):
    """``A[k-1, k-1] = -1`` on a positive definite ``A``: LAPACK's ``info`` is ``k``, and so is
    every backend's status; except the engine of collectives where its own tile is narrower
    than the layout's (the default): there LAPACK's ``info`` of ``A`` in its order, as
    documented (docs/sharp-bits.md), at orders where that order fails elsewhere (asserted:
    else the case would not tell the two apart), and ``A``'s own with ``T_A`` its own tile."""
    backend, mesh, spec = ordered
    n, dtype = _n(mesh), np.float64
    permuted = backend == "jax" and mesh.size > 1
    differs = []
    for k in [3, min(n // mesh.size + 2, n), n - 1]:
        a = hpd(n, dtype, seed=4)
        a[k - 1, k - 1] = -1
        assert _potrf_info(a) == k
        if permuted:
            in_engine_order = _engine_info(a, mesh.size)
            differs.append(in_engine_order != k)
            _check(_hermitian_routines(a, mesh, backend, spec), in_engine_order)
            tile = _inner(n // mesh.size, n, mesh.size)
            _check(_hermitian_routines(a, mesh, backend, spec, T_A=tile), k)
        else:
            _check(_hermitian_routines(a, mesh, backend, spec), k)
    assert not permuted or any(differs)


def test_singular_lu_is_lapacks_first_zero_pivot(ordered):
    """A zero column ``c`` of ``A``: ``U[c, c]`` is the first exact zero of ``U``'s diagonal,
    LAPACK's ``info`` ``c + 1``, every backend's status; except the engine of collectives
    where its own tile is narrower than the layout's (the default): there the first zero pivot
    of ``A``'s columns in its order, as documented (docs/sharp-bits.md), and ``A``'s own with
    ``T_A`` its own tile."""
    backend, mesh, spec = ordered
    n, dtype = _n(mesh), np.float64
    permuted = backend == "jax" and mesh.size > 1
    differs = []
    for column in [2, min(n // mesh.size + 1, n - 1), n - 2]:
        a = random(n, dtype, seed=5) + n * np.eye(n, dtype=dtype)
        a[:, column] = 0
        assert _getrf_info(a) == column + 1
        if permuted:
            in_engine_order = _getrf_info(a[:, _engine_order(n, mesh.size)])
            differs.append(in_engine_order != column + 1)
            _check(_lu_routines(a, mesh, backend, spec), in_engine_order)
            tile = _inner(n // mesh.size, n, mesh.size)
            _check(_lu_routines(a, mesh, backend, spec, T_A=tile), column + 1)
        else:
            _check(_lu_routines(a, mesh, backend, spec), column + 1)
    assert not permuted or any(differs)


def test_vmap_keeps_each_members_status():
    """Under ``jax.vmap`` each matrix keeps its own status: 0, LAPACK's ``k`` (of ``A`` in the
    engine's order, as unbatched), ``N + 1`` for a NaN."""
    mesh = _mesh(jax.device_count())
    if mesh.size == 1:
        pytest.skip("the engine of collectives runs on several devices")
    n = _n(mesh)
    k = n // mesh.size + 2
    good = hpd(n, seed=6)
    bad = good.copy()
    bad[k - 1, k - 1] = -1
    broken = good.copy()
    broken[4, 4] = np.nan
    batch = jax.device_put(
        jnp.asarray(np.stack([good, bad, broken])),
        jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, None, "x")),
    )

    @jax.jit
    @jax.vmap
    def solve(a):
        return jaxmg.potrs(a, jnp.ones(n), mesh=mesh, backend="jax", return_status=True)

    x, status = solve(batch)
    k_engine = _engine_info(bad, mesh.size)
    assert k_engine > 0
    np.testing.assert_array_equal(np.asarray(status), [0, k_engine, n + 1])
    x = np.asarray(x)
    assert not np.isnan(x[0]).any() and np.isnan(x[1:]).all()


def test_decompositions_of_a_non_finite_a(place):
    """``qr`` (and on one device ``svd``, ``polar`` and ``lstsq``, JAX's own there) of an
    ``M x N`` ``A`` holding NaN: status ``min(M, N) + 1``, as the Hermitian solver of that order
    their other engines are made of reports, and NaN outputs. (On several devices ``svd``,
    ``polar`` and ``lstsq`` take their status from ``syevd`` and ``cho_factor``, above; their
    programs take a minute to compile here.)"""
    backend, mesh, spec = place
    m, n = 2 * _n(mesh), _n(mesh)
    a = random(m, np.float64, seed=7, cols=n)
    a[5, 3] = np.nan
    A = put(a, mesh, spec)
    q, r, status = jaxmg.qr(A, backend=backend, return_status=True)
    assert int(status) == n + 1 and _nan(q) and _nan(r)
    if mesh.size > 1:
        return
    u, s, vh, st_svd = jaxmg.svd(A, backend=backend, return_status=True)
    x, *_, st_lstsq = jaxmg.lstsq(A, jnp.ones(m), backend=backend, return_status=True)
    u_p, p, st_polar = jaxmg.polar(put(a[:n], mesh, spec), backend=backend, return_status=True)
    assert int(st_svd) == int(st_lstsq) == int(st_polar) == n + 1
    assert all(_nan(o) for o in (u, s, vh, x, u_p, p))
