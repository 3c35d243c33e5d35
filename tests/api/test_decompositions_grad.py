"""Derivatives of jaxmg.svd / qr / polar / lstsq: jvp against JAX's own rules for
``jnp.linalg`` on the gathered matrix (one device), gradients against central differences,
``jax.test_util.check_grads``, and a mesh with Auto axes. Left out of the 3- and 8-device runs
(noxfile.NARROW), as the other derivative tests are: the rules are the same code there."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from test_decompositions import CASES, FORMS, matrix, mesh_of_all, put, shapes

import jaxmg


def _gathered(a):
    return jnp.asarray(np.asarray(a))


def _tangent(shape, dtype, seed):
    return matrix(shape, dtype, seed=seed)


@pytest.mark.parametrize(("kind", "form"), CASES)
def test_svd_jvp_against_jax(kind, form):
    """The tangents of gauge-invariant functions of the SVD (s, and U f(s) Vh), and of U and Vh
    after fixing each vector's sign as numpy's, against JAX's rule on one device."""
    shape = shapes()[kind]
    dtype = np.float64
    a = matrix(shape, dtype, seed=9)
    da = _tangent(shape, dtype, seed=10)

    def invariant(svd):
        def f(x):
            u, s, vh = svd(x)
            return s, (u * jnp.tanh(s)[None, :]) @ vh

        return f

    ours = jax.jvp(invariant(jaxmg.svd), (put(a, FORMS[form]),), (put(da, FORMS[form]),))
    ref = jax.jvp(
        invariant(lambda x: jnp.linalg.svd(x, full_matrices=False)),
        (_gathered(a),),
        (_gathered(da),),
    )
    for x, y in zip(jax.tree.leaves(ours), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-10)


@pytest.mark.parametrize(("kind", "form"), CASES)
def test_qr_jvp_against_jax(kind, form):
    shape = shapes()[kind]
    dtype = np.complex128
    a = matrix(shape, dtype, seed=11)
    da = _tangent(shape, dtype, seed=12)
    (q, r), (dq, dr) = jax.jvp(jaxmg.qr, (put(a, FORMS[form]),), (put(da, FORMS[form]),))
    (q0, r0), (dq0, dr0) = jax.jvp(jnp.linalg.qr, (_gathered(a),), (_gathered(da),))
    k = min(shape)
    phases = np.diag(np.asarray(r0))[:k] / np.abs(np.diag(np.asarray(r0))[:k])
    np.testing.assert_allclose(np.asarray(q), np.asarray(q0) * phases, atol=1e-12)
    np.testing.assert_allclose(np.asarray(dq), np.asarray(dq0) * phases, atol=1e-10)
    np.testing.assert_allclose(
        np.asarray(dr), np.conj(phases)[:, None] * np.asarray(dr0), atol=1e-10
    )


@pytest.mark.parametrize("form", FORMS)
def test_polar_and_lstsq_derivatives(form):
    """jvp of polar against JAX's SVD-based polar, and the gradient of a least-squares loss
    (reverse mode, under jit) against central differences."""
    shape = shapes()["square"]
    a = matrix(shape, np.float64, seed=13)
    da = _tangent(shape, np.float64, seed=14)
    ours = jax.jvp(jaxmg.polar, (put(a, FORMS[form]),), (put(da, FORMS[form]),))
    ref = jax.jvp(
        lambda x: jax.scipy.linalg.polar(x, method="svd"), (_gathered(a),), (_gathered(da),)
    )
    for x, y in zip(jax.tree.leaves(ours), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-10)

    tall = shapes()["tall"]
    a = matrix(tall, np.float64, seed=15)
    b = jnp.asarray(matrix((tall[0], 1), np.float64, seed=16)[:, 0])

    def loss(x):
        return jnp.sum(jaxmg.lstsq(x, b)[0] ** 2)

    grad = np.asarray(jax.jit(jax.grad(loss))(put(a, FORMS[form])))
    direction = _tangent(tall, np.float64, seed=17)
    h = 1e-6
    plus = float(loss(put(a + h * direction, FORMS[form])))
    minus = float(loss(put(a - h * direction, FORMS[form])))
    np.testing.assert_allclose(np.sum(grad * direction), (plus - minus) / (2 * h), rtol=1e-6)


@pytest.mark.parametrize("form", FORMS)
def test_on_auto_axes_under_jit(form):
    """A mesh with Auto axes (XLA's partitioner places what jaxmg does not), under jit with
    in_specs: the four routines and a gradient, against numpy and finite differences."""
    d = jax.device_count()
    mesh = jax.make_mesh((d,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    spec = FORMS[form]
    shape = shapes()["tall"]
    a = matrix(shape, np.float64, seed=21)
    A = jax.device_put(a, NamedSharding(mesh, spec))
    b = jnp.asarray(matrix((shape[0], 1), np.float64, seed=22)[:, 0])
    kw = dict(mesh=mesh, in_specs=spec)

    @jax.jit
    def run(A):
        u, s, vh = jaxmg.svd(A, **kw)
        q, r = jaxmg.qr(A, **kw)
        up, p = jaxmg.polar(A, **kw)
        x = jaxmg.lstsq(A, b, **kw)[0]
        return u, s, vh, q, r, up, p, x

    u, s, vh, q, r, up, p, x = (np.asarray(y) for y in run(A))
    np.testing.assert_allclose(s, np.linalg.svd(a, compute_uv=False), rtol=1e-12)
    np.testing.assert_allclose((u * s) @ vh, a, atol=1e-12)
    np.testing.assert_allclose(q @ r, a, atol=1e-12)
    np.testing.assert_allclose(up @ p, a, atol=1e-12)
    np.testing.assert_allclose(x, np.linalg.lstsq(a, np.asarray(b), rcond=None)[0], atol=1e-12)

    def loss(A):
        return jnp.sum(jaxmg.svd(A, compute_uv=False, **kw) ** 3)

    grad = np.asarray(jax.jit(jax.grad(loss))(A))
    direction = matrix(shape, np.float64, seed=23)
    h = 1e-6
    diff = float(loss(A + h * direction) - loss(A - h * direction)) / (2 * h)
    np.testing.assert_allclose(np.sum(grad * direction), diff, rtol=1e-6)


@pytest.mark.parametrize(
    "routine",
    ["svd_values", "svd_invariant", "qr", "qr_complex", "polar", "lstsq"],
)
@pytest.mark.usefixtures("once_per_suite")
def test_check_grads(routine):
    """jax.test_util.check_grads, forward and reverse, first order, against JAX's own numerical
    differences (tall float64, rows)."""
    from jax.test_util import check_grads

    shape = shapes()["tall"]
    dtype = np.complex128 if routine == "qr_complex" else np.float64
    a = matrix(shape, dtype, seed=24)
    b = jnp.asarray(matrix((shape[0], 1), np.float64, seed=25)[:, 0])
    kw = dict(mesh=mesh_of_all(), in_specs=FORMS["rows"])  # check_grads' points carry none
    f = {
        "svd_values": lambda A: jaxmg.svd(A, compute_uv=False, **kw),
        "svd_invariant": lambda A: (lambda u, s, vh: (u * s[None, :] ** 2) @ vh)(
            *jaxmg.svd(A, **kw)
        ),
        "qr": lambda A: jaxmg.qr(A, **kw),
        "qr_complex": lambda A: jaxmg.qr(A, **kw),
        "polar": lambda A: jaxmg.polar(A, **kw),
        "lstsq": lambda A: jaxmg.lstsq(A, b, **kw)[0],
    }[routine]
    check_grads(jax.jit(f), (put(a, FORMS["rows"]),), order=1, modes=("fwd", "rev"), atol=1e-6)
