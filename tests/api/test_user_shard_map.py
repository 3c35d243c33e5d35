"""The ``*_no_shardmap`` functions inside a user's own ``jax.shard_map``, with JAX's defaults
(``check_vma=True``) and with ``check_vma=False``, ``A`` sharded by rows and by columns over every
device: their values against numpy, ``grad`` in ``b`` against numpy's solve, and ``grad`` in ``A``,
the symmetric one of the global functions (that of ``X -> f((X + X^T) / 2)``), against central
differences along symmetric directions ``E + E^T`` and against the global function's gradient.
And a function on global arrays called inside ``shard_map`` names the one to call there.

Backend ``"jax"`` throughout (the default where it says so); ``N = 8 x`` the device count.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from matrices import FORMS, hpd, mesh_of, put, random

import jaxmg


def _size():
    return 8 * jax.device_count()


def _mapped(body, mesh, in_specs, out_specs, check_vma):
    """``body`` in the user's ``jax.shard_map``, with ``check_vma`` left to JAX's default where
    it is ``True``."""
    options = {} if check_vma else {"check_vma": False}
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **options)


@pytest.mark.parametrize("form", ["rows", pytest.param("cols", marks=pytest.mark.grid_sweep)])
def test_values(form):
    """potrs, potri and syevd on local blocks, in one shard_map with JAX's defaults
    (``check_vma=False``: the gradients' tests)."""
    n, spec = _size(), FORMS[form]
    mesh = mesh_of()
    a = hpd(n, seed=1)
    b = random(n, seed=2, cols=2)
    options = dict(sharded_by=form, backend="jax")

    def body(a, b):
        x, s1 = jaxmg.potrs_no_shardmap(a, b, **options)
        inverse, s2 = jaxmg.potri_no_shardmap(a, **options)
        w, v, s3 = jaxmg.syevd_no_shardmap(a, **options)
        return x, inverse, w, v, jnp.concatenate([s1, s2, s3])

    out_specs = (P(), spec, P(), spec, P())
    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, P()), out_specs=out_specs))
    x, inverse, w, v, status = program(put(a, mesh, spec), put(b, mesh, P()))
    np.testing.assert_array_equal(status, 0)
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(inverse, np.linalg.inv(a), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(a), rtol=1e-10, atol=1e-12)
    v = np.asarray(v)
    np.testing.assert_allclose(a @ v, v * np.asarray(w), atol=1e-10)
    np.testing.assert_allclose(v.T @ v, np.eye(n), atol=1e-10)


@pytest.mark.grid_sweep
def test_default_backend():
    """``backend=None`` inside a shard_map with JAX's defaults: the engine it chooses runs
    (syevd without eigenvectors too)."""
    form = "cols"
    n, spec = _size(), FORMS[form]
    mesh = mesh_of()
    a, b = hpd(n, seed=3), random(n, seed=4, cols=1)

    def body(a, b):
        x, status = jaxmg.potrs_no_shardmap(a, b, sharded_by=form)
        w, _ = jaxmg.syevd_no_shardmap(a, return_eigenvectors=False, sharded_by=form)
        return x, w, status

    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec, P()), out_specs=P()))
    x, w, status = program(put(a, mesh, spec), put(b, mesh, P()))
    np.testing.assert_array_equal(status, 0)
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(a), rtol=1e-10, atol=1e-12)


# --- gradients ------------------------------------------------------------------------------------


def _weights(n, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 2)), rng.standard_normal((n, n)), rng.standard_normal(n)


def _loss(routine, form, a, b, c, check_vma, local=True):
    """A scalar of ``routine``'s results on ``A`` (and ``b``): ``*_no_shardmap`` in the user's
    shard_map, or (``local=False``) the global function; ``c``: fixed weights."""
    mesh = mesh_of()
    spec = FORMS[form]
    weights, matrix, u = c
    if routine == "potrs":
        if local:
            solve = functools.partial(jaxmg.potrs_no_shardmap, sharded_by=form, backend="jax")
            body = _mapped(lambda a, b: solve(a, b)[0], mesh, (spec, P()), P(), check_vma)
            x = body(a, b)
        else:
            x = jaxmg.potrs(a, b, backend="jax")
        return jnp.sum(x * weights)
    if routine == "potri":
        if local:
            invert = functools.partial(jaxmg.potri_no_shardmap, sharded_by=form, backend="jax")
            inverse = _mapped(lambda a: invert(a)[0], mesh, (spec,), spec, check_vma)(a)
        else:
            inverse = jaxmg.potri(a, backend="jax")
        return jnp.sum(inverse * matrix)
    if local:
        eigh = functools.partial(jaxmg.syevd_no_shardmap, sharded_by=form, backend="jax")
        w, v = _mapped(lambda a: eigh(a)[:2], mesh, (spec,), (P(), spec), check_vma)(a)
    else:
        w, v = jaxmg.syevd(a, backend="jax")
    # eigenvalues and a function of the eigenvectors that does not depend on their signs
    return jnp.sum(w * u) + jnp.sum((u @ v) ** 2 * jnp.arange(w.shape[0], dtype=w.dtype))


@pytest.mark.parametrize(
    ("routine", "form", "check_vma"),
    [
        pytest.param("potrs", "cols", False, marks=pytest.mark.grid_sweep),
        ("syevd", "rows", True),
        pytest.param("syevd", "cols", False, marks=pytest.mark.grid_sweep),
        pytest.param("potri", "cols", True, marks=pytest.mark.grid_sweep),
        pytest.param("potri", "rows", False, marks=pytest.mark.grid_sweep),
    ],
)
def test_gradient_in_a(routine, form, check_vma):
    """``grad`` in ``A`` is symmetric, and central differences of the function along a
    symmetric direction ``E + E^T`` agree with it: it is the gradient of ``X -> f((X + X^T) /
    2)``, the global functions' (docs/api.md, Derivatives); for syevd, the global syevd's."""
    n, spec = _size(), FORMS[form]
    mesh = mesh_of()
    a0 = hpd(n, seed=5, shift=2.0)  # syevd: eigenvalues apart, eigenvectors well defined
    if routine == "syevd":
        a0 = a0 + np.diag(np.arange(n, dtype=np.float64))
    b = put(random(n, seed=6, cols=2), mesh, P())
    c = _weights(n, seed=7)
    loss = functools.partial(_loss, routine, form, c=c, check_vma=check_vma)
    value_and_grad = jax.jit(jax.value_and_grad(loss))  # one program for the three points
    _, grad = value_and_grad(put(a0, mesh, spec), b)
    grad = np.asarray(grad)
    np.testing.assert_allclose(grad, grad.T, rtol=1e-12, atol=1e-14)
    e = random(n, seed=8)
    direction = e + e.T
    h = 1e-5
    plus, _ = value_and_grad(put(a0 + h * direction, mesh, spec), b)
    minus, _ = value_and_grad(put(a0 - h * direction, mesh, spec), b)
    np.testing.assert_allclose((plus - minus) / (2 * h), np.sum(grad * direction), rtol=1e-6)
    if routine == "syevd" and check_vma:
        global_loss = functools.partial(_loss, routine, form, c=c, check_vma=True, local=False)
        want = jax.jit(jax.grad(global_loss))(put(a0, mesh, spec), b)
        np.testing.assert_allclose(grad, want, rtol=1e-8, atol=1e-12)


def test_potrs_gradient_in_b():
    """``grad`` in ``b`` of potrs_no_shardmap: ``A^-1`` times the weights (numpy's solve), and in
    ``A`` the symmetric ``-(y x^T + x y^T) / 2``, ``y = A^-1`` times the weights."""
    form = "rows"
    n, spec = _size(), FORMS[form]
    mesh = mesh_of()
    a0, b0 = hpd(n, seed=9), random(n, seed=10, cols=2)
    c = _weights(n, seed=11)
    loss = jax.jit(functools.partial(_loss, "potrs", form, c=c, check_vma=True))
    grad_a, grad_b = jax.jit(jax.grad(loss, argnums=(0, 1)))(
        put(a0, mesh, spec), put(b0, mesh, P())
    )
    y, x = np.linalg.solve(a0, c[0]), np.linalg.solve(a0, b0)
    np.testing.assert_allclose(grad_b, y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grad_a, -(y @ x.T + x @ y.T) / 2, rtol=1e-10, atol=1e-12)


# --- a function on global arrays inside shard_map ------------------------------------------------


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.parametrize(
    ("call", "local"),
    [
        (lambda a, b: jaxmg.potrs(a, b), "jaxmg.potrs_no_shardmap"),
        (lambda a, b: jaxmg.potri(a), "jaxmg.potri_no_shardmap"),
        (lambda a, b: jaxmg.syevd(a), "jaxmg.syevd_no_shardmap"),
        (lambda a, b: jaxmg.cho_factor(a).factor, "jaxmg.potrs_no_shardmap"),
        (lambda a, b: jaxmg.lu_solve(a, b), "outside the shard_map"),
        (lambda a, b: jaxmg.svd(a)[1], "outside the shard_map"),
    ],
    ids=["potrs", "potri", "syevd", "cho_factor", "lu_solve", "svd"],
)
def test_global_function_inside_shard_map(call, local):
    n, spec = _size(), FORMS["rows"]
    mesh = mesh_of()
    program = jax.jit(jax.shard_map(call, mesh=mesh, in_specs=(spec, P()), out_specs=P()))
    with pytest.raises(ValueError, match=f"inside jax.shard_map.*{local}"):
        program(put(hpd(n), mesh, spec), put(random(n, cols=1), mesh, P()))
