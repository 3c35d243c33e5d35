"""Factoring in place (issue 26): a donated ``A`` is the buffer the native call works in.

Asserted on the compiled programs (XLA's ``input_output_alias`` and its memory analysis, never
on timings), on the results against numpy, on what ``donate=True`` does to the caller's arrays,
and on derivatives under ``jax.jit(..., donate_argnums=0)``.
"""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxmg
from jaxmg.programs import derivatives as _derivatives, routines as _programs
from jaxmg.solvers import hermitian as _api

FORMS = {"cols": P(None, "x"), "rows": P("x", None)}


def _mesh():
    return jax.make_mesh((jax.device_count(),), ("x",))


def _hpd(n, seed=0):
    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    return m @ m.T / n + np.eye(n)


def _general(n, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)


def _put(a, form):
    return jax.device_put(jnp.asarray(a), NamedSharding(_mesh(), FORMS[form]))


def _aliased_parameters(compiled) -> set:
    """The parameters XLA's program hands over to an output (its ``input_output_alias``)."""
    header = compiled.as_text().splitlines()[0]  # HloModule ..., input_output_alias={ ... }
    return {int(p) for p in re.findall(r"\{\d*\}: \((\d+), \{\}, (?:may|must)-alias\)", header)}


def _blocks(compiled, n):
    """Arguments + outputs - aliased + temporaries per device, in blocks of A (float64)."""
    m = compiled.memory_analysis()
    total = (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + m.temp_size_in_bytes
    )
    return total / (n * n * 8 / jax.device_count())


def _donating_program(routine, a, b, T_A, backend):
    """``(donating program, args)`` that ``routine(..., donate=True)`` runs."""
    task = {"cho_factor": "potrs", "lu_factor": "getrf"}.get(routine, routine)
    call, _ = _api._prepare(
        a, T_A, a.sharding.mesh, a.sharding.spec, False, "native", True, "t", task, backend
    )
    return {
        "potrs": (_api._potrs_donated, (call, True, True, b.shape, a, b)),
        "cho_factor": (_api._potrf_donated, (call, a)),
        "lu_factor": (_api._getrf_donated, (call, a)),
        "potri": (_api._potri_donated, (call, True, a)),
        "syevd": (_api._syevd_donated, (call, True, True, a)),
    }[routine]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("routine", ["potrs", "cho_factor", "lu_factor", "potri", "syevd"])
def test_donated_a_is_aliased_to_a_result(routine, form):
    """Every routine's donating program hands A's buffer to a result of its shape, with no
    'donated buffers were not usable' warning (which is what potrs gave before)."""
    n = 8 * jax.device_count()
    a = _put(_hpd(n), form)
    b = jnp.ones((n, 1))
    program, args = _donating_program(routine, a, b, None, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unusable donation warns
        compiled = program.lower(*args).compile()
    # Static arguments are no parameters of the compiled program: A is its parameter 0.
    assert 0 in _aliased_parameters(compiled)


@pytest.mark.parametrize("routine", ["potrs", "cho_factor"])
def test_row_sharded_a_donated_is_the_only_copy(routine):
    """Row-sharded A with one tile per device (or a tile that divides the block): the native
    call works in A's own buffer, so the program needs A's block and nothing of its size more.
    Not donated, XLA copies A for the call: two blocks."""
    ndev = jax.device_count()
    n = 16 * ndev
    a = _put(_hpd(n), "rows")
    b = jnp.ones((n, 1))
    for T_A in (n // ndev, 8):
        program, args = _donating_program(routine, a, b, T_A, "mg")
        assert _blocks(program.lower(*args).compile(), n) <= 1.2
        kept = {"potrs": _derivatives._potrs_call, "cho_factor": _programs._potrf_program}[routine]
        assert _blocks(kept.lower(*args).compile(), n) >= 1.9


@pytest.mark.parametrize("form", FORMS)
def test_donate_true_consumes_a_and_b_and_results_match_numpy(form):
    n = 6 * jax.device_count()
    m, g = _hpd(n), _general(n)
    rhs = np.random.default_rng(2).standard_normal(n)

    a, b = _put(m, form), jnp.asarray(rhs)
    x, logdet = jaxmg.potrs(a, b, return_logdet=True, donate=True)
    assert a.is_deleted() and b.is_deleted()
    np.testing.assert_allclose(x, np.linalg.solve(m, rhs), rtol=1e-10)
    np.testing.assert_allclose(logdet, np.linalg.slogdet(m)[1], rtol=1e-12)

    a = _put(m, form)
    inverse = jaxmg.potri(a, donate=True)
    assert a.is_deleted()
    np.testing.assert_allclose(inverse, np.linalg.inv(m), rtol=1e-9, atol=1e-12)

    a = _put(m, form)
    w, v = jaxmg.syevd(a, donate=True)
    assert a.is_deleted()
    np.testing.assert_allclose(w, np.linalg.eigvalsh(m), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(v) @ np.diag(w) @ np.asarray(v).T, m, atol=1e-10)

    a = _put(m, form)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # values alone: still an output to take A's buffer
        w = jaxmg.syevd(a, return_eigenvectors=False, donate=True)
    assert a.is_deleted()
    np.testing.assert_allclose(w, np.linalg.eigvalsh(m), rtol=1e-10)

    a = _put(m, form)
    factor = jaxmg.cho_factor(a, donate=True)
    assert a.is_deleted() and factor.matrix is None
    np.testing.assert_allclose(jaxmg.cho_solve(factor, rhs), np.linalg.solve(m, rhs), rtol=1e-10)
    np.testing.assert_allclose(factor.logdet, np.linalg.slogdet(m)[1], rtol=1e-12)

    a = _put(g, form)
    lu = jaxmg.lu_factor(a, donate=True)
    assert a.is_deleted()
    for trans, op in ((0, g), (1, g.T)):
        x = jaxmg.lu_solve(lu, rhs, trans=trans)
        np.testing.assert_allclose(x, np.linalg.solve(op, rhs), rtol=1e-10)

    a = _put(g, form)
    x = jaxmg.lu_solve(a, rhs, donate=True)
    assert a.is_deleted()
    np.testing.assert_allclose(x, np.linalg.solve(g, rhs), rtol=1e-10)


def test_without_donation_a_survives():
    n = 4 * jax.device_count()
    a = _put(_hpd(n), "rows")
    jaxmg.potrs(a, jnp.ones(n))
    jaxmg.cho_factor(a)
    assert not a.is_deleted()
    np.testing.assert_array_equal(a, _hpd(n))


def test_donate_moved_a_deletes_the_callers_array_too():
    """A that must be resharded first: the moved copy is donated, and the caller's A (given up
    with donate=True) is deleted as well."""
    n = 4 * jax.device_count()
    m = _hpd(n)
    a = jax.device_put(jnp.asarray(m), NamedSharding(_mesh(), P()))  # replicated
    x = jaxmg.potrs(a, jnp.ones(n), mesh=_mesh(), in_specs=P("x", None), donate=True)
    assert a.is_deleted()
    np.testing.assert_allclose(x, np.linalg.solve(m, np.ones(n)), rtol=1e-10)


def test_donate_errors():
    n = 4 * jax.device_count()
    a = _put(_general(n), "cols")
    with pytest.raises(TypeError, match="donate must be True or False"):
        jaxmg.potrs(_put(_hpd(n), "cols"), jnp.ones(n), donate="yes")
    lu = jaxmg.lu_factor(a)
    with pytest.raises(ValueError, match="already"):
        jaxmg.lu_solve(lu, jnp.ones(n), donate=True)
    factor = jaxmg.cho_factor(_put(_hpd(n), "cols"), donate=True)
    with jax.set_mesh(_mesh()), pytest.raises(ValueError, match="donate=True"):
        jax.grad(lambda b: jaxmg.cho_solve(factor, b).sum())(jnp.ones(n))


def test_donate_under_a_trace_is_a_no_op():
    """Inside jit a traced A is no buffer: donate=True changes nothing (donate_argnums does)."""
    n = 4 * jax.device_count()
    m = _hpd(n)
    a = _put(m, "rows")
    x = jax.jit(lambda a: jaxmg.potrs(a, jnp.ones(n), donate=True))(a)
    assert not a.is_deleted()
    np.testing.assert_allclose(x, np.linalg.solve(m, np.ones(n)), rtol=1e-10)


@pytest.mark.parametrize("form", FORMS)
def test_gradient_with_a_donated_to_the_jit(form):
    """grad under jax.jit(..., donate_argnums=0): JAX accepts it; XLA keeps A for the
    derivatives' matvec (it copies A for the factor) and hands A's buffer to the gradient,
    which has A's shape. The gradient is numpy's: d(b^T A^-1 b)/dA = -x x^T, x = A^-1 b, for
    the Hermitian part of A."""
    n = 4 * jax.device_count()
    m = _hpd(n)
    rhs = np.random.default_rng(3).standard_normal(n)

    def loss(a, b):
        x, logdet = jaxmg.potrs(a, b, return_logdet=True)
        return b @ x + logdet

    step = jax.jit(jax.grad(loss), donate_argnums=0)
    a = _put(m, form)
    compiled = step.lower(a, jnp.asarray(rhs)).compile()
    assert 0 in _aliased_parameters(compiled)
    grad = step(a, jnp.asarray(rhs))
    assert a.is_deleted()
    x = np.linalg.solve(m, rhs)
    np.testing.assert_allclose(grad, -np.outer(x, x) + np.linalg.inv(m), rtol=1e-8, atol=1e-12)
