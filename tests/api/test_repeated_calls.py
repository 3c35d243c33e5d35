"""One traced jaxmg call that becomes several HLO instructions.

A jitted function that a program calls more than once with the same static arguments is traced
once: its jaxmg call gets one trace-time ``call_id``, and XLA inlines the calls into independent
instructions with the same attributes. jaxmg's own LU solve is such a function: the forward
derivatives of ``lu_solve`` (twice, trans 0 and 1) and of ``lu_solve`` on the matrix itself
call it several times in one program. The devices may run those instructions in different
orders; each instruction's participants must still meet each other (csrc/ffi/instance.h), or the
call fails ("two participants claim mesh position ...") or, where the shapes agree, solves a
device's shard of one problem with the others' shards of another.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, PartitionSpec as P

import jaxmg


def problem(n):
    rng = np.random.default_rng(25)
    g = rng.standard_normal((n, n)) + n * np.eye(n)
    return g, rng.standard_normal((n, 2)), rng.standard_normal((n, n)), rng.standard_normal((n, 2))


def program():
    mesh = jax.make_mesh((jax.device_count(),), ("x",), axis_types=(AxisType.Explicit,))
    # The native engine on every device count (one device would otherwise run JAX's solvers).
    kw = dict(mesh=mesh, in_specs=P(None, "x"), backend="mg")

    def factored(g, b):
        factor = jaxmg.lu_factor(g, **kw)
        return jaxmg.lu_solve(factor, b, trans=0), jaxmg.lu_solve(factor, b, trans=1)

    def direct(g, b):
        return jaxmg.lu_solve(g, b, **kw)

    @jax.jit
    def tangents(g, b, dg, db):
        # Replicated operands: the program reshards them with collectives of its own.
        return jax.jvp(factored, (g, b), (dg, db))[1], jax.jvp(direct, (g, b), (dg, db))[1]

    return tangents


def call_ids(hlo, target):
    """The call_id attribute of each custom call to `target` in compiled HLO text."""
    ids = []
    for line in hlo.splitlines():
        if f'custom_call_target="{target}"' in line:
            ids.append(int(re.search(r"call_id = (\d+)", line).group(1)))
    return ids


def test_one_call_id_is_several_instructions():
    args = tuple(map(jnp.asarray, problem(4 * jax.device_count())))
    ids = call_ids(program().lower(*args).compile().as_text(), "jaxmg_getrs")
    assert len(ids) > len(set(ids)), ids


def test_each_instruction_meets_its_own_participants():
    g, b, dg, db = problem(4 * jax.device_count())
    x0, x1 = np.linalg.solve(g, b), np.linalg.solve(g.T, b)
    dx0 = np.linalg.solve(g, db - dg @ x0)  # d(G^-1 b) = G^-1 (db - dG x)
    dx1 = np.linalg.solve(g.T, db - dg.T @ x1)
    tangents = program()
    args = tuple(map(jnp.asarray, (g, b, dg, db)))
    for _ in range(10):
        (t0, t1), t_direct = tangents(*args)
        for got, want in ((t0, dx0), (t1, dx1), (t_direct, dx0)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-10)
