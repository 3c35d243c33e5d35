"""LU solves on backend "mg" use the engine's ``N`` solve alone, as cuSolverMg requires.

On an H100 cuSolverMg's ``getrs`` refused ``CUBLAS_OP_T`` and ``_C`` (info = -1), and its
``getrf`` refused tiles of 1024 and more. jaxmg therefore factors ``A`` itself whatever its
sharding (a row-sharded ``A`` is transposed first) and solves with ``A^T`` or ``A^H`` through the
factor of ``A^T P`` built from ``A``'s (``_programs._transposed_lu``). Here: every route of that
against numpy on the CPU twin (which refuses what cuSolverMg refuses), and, lowered for CUDA on
this machine, that no GPU program asks cuSolverMg for anything else.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxmg
import jaxmg_cuda

FORMS = {"cols": P(None, "x"), "rows": P("x", None)}
OPS = {0: lambda m: m, 1: lambda m: m.T, 2: lambda m: m.conj().T}


def pivoting(n, dtype, seed=0):
    """A general matrix whose LU needs row interchanges everywhere: a zero leading entry and
    rows scaled so that partial pivoting reorders them."""
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        m = m + 1j * rng.standard_normal((n, n))
    m[0, 0] = 0
    m *= np.logspace(0, 2, n)[rng.permutation(n), None]
    return m.astype(dtype)


def scaled_residual(op_a, x, b):
    eps = np.finfo(op_a.dtype).eps
    r = np.linalg.norm(op_a @ x - b) / (np.linalg.norm(op_a, 1) * np.linalg.norm(x))
    return r / (op_a.shape[0] * eps)


# The whole grid runs with 4 devices; the other counts run float64 through the in-place
# relayout with a tile that splits the shards.
SWEPT = pytest.mark.grid_sweep


@pytest.mark.parametrize("dtype", [np.float64, pytest.param(np.complex128, marks=SWEPT)])
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(
    "T_A, relayout, per_device",
    [
        pytest.param(None, "native", 4, id="whole-shards", marks=SWEPT),
        pytest.param(3, "native", 4, id="native-T3"),
        pytest.param(3, "jax", 4, id="jax-T3", marks=SWEPT),
        pytest.param(4, "native", 6, id="native-T4-of-6", marks=SWEPT),
    ],
)
def test_every_trans_on_every_route(dtype, form, T_A, relayout, per_device):
    """Each (form, tile, relayout) leaves the factor in another place of the block-cyclic
    layout (padding, the in-place relayout's room): solves with A, A^T and A^H from one factor,
    and the factor's status, against numpy."""
    ndev = jax.device_count()
    n = per_device * ndev
    mesh = jax.make_mesh((ndev,), ("x",), axis_types=(AxisType.Auto,))
    a0 = pivoting(n, dtype)
    b0 = np.random.default_rng(1).standard_normal((n, 3)).astype(dtype)
    a = jax.device_put(a0, NamedSharding(mesh, FORMS[form]))
    factor = jaxmg.lu_factor(a, T_A, relayout=relayout, backend="mg")
    assert int(factor.status) == 0
    for trans, op in OPS.items():
        x = np.asarray(jaxmg.lu_solve(factor, jnp.asarray(b0), trans=trans))
        assert scaled_residual(op(a0), x, b0) < 30, trans


@pytest.mark.parametrize("form", FORMS)
def test_singular_status_is_the_factor_of_a_in_both_forms(form):
    """The status is LAPACK's for A (the 1-based column of U's first exact zero), whatever the
    sharding, and every solve from that factor is NaN."""
    ndev = jax.device_count()
    n = 4 * ndev
    mesh = jax.make_mesh((ndev,), ("x",))
    a0 = pivoting(n, np.float64)
    a0[:, n - 2] = 0.0
    factor = jaxmg.lu_factor(jax.device_put(a0, NamedSharding(mesh, FORMS[form])), backend="mg")
    assert int(factor.status) == n - 1
    for trans in OPS:
        x = jaxmg.lu_solve(factor, jnp.ones(n), trans=trans)
        assert np.isnan(np.asarray(x)).all(), trans


# --- what reaches cuSolverMg, lowered for CUDA on this machine -------------------------------


def _gpu_mesh(ndev=2):
    if not jaxmg_cuda.has_cuda_support():
        pytest.skip("jaxmg-cuda was built without CUDA: its GPU targets cannot be lowered")
    return jax.sharding.AbstractMesh(
        (ndev,), ("x",), axis_types=(AxisType.Explicit,),
        abstract_device=jax.sharding.AbstractDevice("gpu", None, "cuda"),
    )  # fmt: skip


def _lowered(fn, mesh, n, spec, *more):
    args = [jax.ShapeDtypeStruct((n, n), jnp.complex128, sharding=NamedSharding(mesh, spec))]
    args += [
        jax.ShapeDtypeStruct(s, jnp.complex128, sharding=NamedSharding(mesh, P())) for s in more
    ]
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.parametrize("form", FORMS)
def test_gpu_programs_ask_getrs_for_n_alone(form):
    """Every lu_solve (each trans, both forms, and its derivative, which solves with the
    transposed operator) lowers for CUDA to getrs calls with trans = 'N' only."""
    mesh, n = _gpu_mesh(), 16
    spec = FORMS[form]
    for trans in OPS:

        def solve(a, b, trans=trans):
            return jaxmg.lu_solve(a, b, 4, mesh=mesh, trans=trans)

        def loss(a, b, trans=trans):
            return jnp.sum(jnp.abs(solve(a, b, trans)) ** 2)

        for fn in (solve, jax.grad(loss, argnums=(0, 1))):
            text = _lowered(fn, mesh, n, spec, (n, 2))
            modes = re.findall(r"trans = (\d+) : i64", text)
            assert text.count("custom_call @jaxmg_getrs(") == len(modes) >= 1, (trans, text)
            assert set(modes) == {str(ord("N"))}, (trans, modes)


@pytest.mark.usefixtures("once_per_suite")
def test_gpu_lu_tile_over_the_limit_is_lowered_with_a_warning():
    """cuSolverMg's getrf refused T_A >= 1024 on an H100: a wider tile is lowered to 512 with a
    warning, and the automatic tile stays within the limit without one."""
    mesh, n = _gpu_mesh(), 2 * 4096
    with pytest.warns(UserWarning, match="jaxmg.lu_factor: cuSolverMg's getrf .* at most 512"):
        text = _lowered(lambda a: jaxmg.lu_factor(a, 1024, mesh=mesh), mesh, n, FORMS["cols"])
    assert "custom_call @jaxmg_getrf(" in text and "T_A = 512 : i64" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        text = _lowered(lambda a: jaxmg.lu_factor(a, mesh=mesh), mesh, n, FORMS["cols"])
    tiles = {int(t) for t in re.findall(r"T_A = (\d+) : i64", text)}
    assert tiles and max(tiles) <= 512, tiles
