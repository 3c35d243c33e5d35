"""The ring products and the blocked triangular solve of jaxmg.decompositions.products against
numpy, by rows and by columns, at the suite's device count; each with its blocks sent in pieces
(``_products.PIECES``; ``SPLIT_BYTES`` 0, as blocks of large matrices are) and whole (as these
small ones go otherwise), and by columns also a width whose blocks do not split."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxmg.decompositions import products as _products

FORMS = {"rows": P("x", None), "cols": P(None, "x")}


def mesh():
    return jax.make_mesh((jax.device_count(),), ("x",))


def sharded(a, form):
    return jax.device_put(a, NamedSharding(mesh(), FORMS[form]))


def random(shape, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


@pytest.fixture(params=["pieces", "whole"], autouse=True)
def split(request, monkeypatch):
    if request.param == "pieces":
        monkeypatch.setattr(_products, "SPLIT_BYTES", 0)
    jax.clear_caches()  # the programs are traced again, with this choice
    yield request.param
    jax.clear_caches()


def widths():
    p = jax.device_count()
    return [4 * p, 3 * p]  # by columns, blocks of 4 columns go in pieces; blocks of 3 whole


CASES = [("rows", 0), ("cols", 0), ("cols", 1)]  # (form, index of the width)


@pytest.mark.parametrize("form, k_index", CASES)
def test_gram_and_times(form, k_index):
    k = widths()[k_index]
    m = 2 * k  # as QDWH's stacked matrix
    x, y, g = random((m, k), 0), random((m, k), 1), random((k, k), 2)
    spec = FORMS[form]
    gram = jax.jit(_products.gram, static_argnums=(2, 3))(
        sharded(x, form), sharded(y, form), mesh(), spec
    )
    assert gram.sharding.spec == spec
    np.testing.assert_allclose(np.asarray(gram), x.conj().T @ y, rtol=1e-12, atol=1e-12)
    product = jax.jit(_products.times, static_argnums=(2, 3))(
        sharded(x, form), sharded(g, form), mesh(), spec
    )
    assert product.sharding.spec == spec
    np.testing.assert_allclose(np.asarray(product), x @ g, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form, k_index", CASES)
@pytest.mark.parametrize("lower", [False, True])
def test_right_triangular_solve(form, lower, k_index):
    k = widths()[k_index]
    m = 2 * k
    x = random((m, k), 3)
    t = random((k, k), 4) + 4 * k * np.eye(k)  # well conditioned
    t = np.tril(t) if lower else np.triu(t)
    junk = np.tril(random((k, k), 5), -1) if not lower else np.triu(random((k, k), 5), 1)
    spec = FORMS[form]
    # the other triangle is never read (a Cholesky factor's holds what the engine left there)
    solve = jax.jit(_products.right_triangular_solve, static_argnums=(2, 3, 4))
    y = solve(sharded(x, form), sharded(t + junk, form), mesh(), spec, lower)
    assert y.sharding.spec == spec
    np.testing.assert_allclose(np.asarray(y) @ t, x, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", FORMS)
def test_distance_from_orthonormal(form):
    k = widths()[0]
    q, _ = np.linalg.qr(random((2 * k, k), 6))
    q[:, 0] *= 1 + 1e-3  # one column a little long: |Q^H Q - I| is 2e-3 + 1e-6 at (0, 0)
    distance = jax.jit(_products.distance_from_orthonormal, static_argnums=(1, 2))(
        sharded(q, form), mesh(), FORMS[form]
    )
    np.testing.assert_allclose(
        float(distance), np.abs(q.conj().T @ q - np.eye(k)).max(), rtol=1e-10
    )
