"""``jax.vmap`` of backend ``"jax"``'s solvers on several CPU devices finishes (issue 56).

jaxlib's CPU LAPACK kernels split a batch of matrices over XLA:CPU's intra-op thread pool and
wait for the chunks on a thread of that same pool; when every thread of the pool waits (for
chunks, or in a collective's rendezvous), nothing runs them and the program hangs until XLA's
rendezvous aborts the process (``benchmarks/vmap_deadlock.py`` reproduces it in plain JAX).
The engine of collectives therefore calls LAPACK one matrix at a time under ``jax.vmap`` on
CPUs (:mod:`jaxmg.engines._unbatched`), and keeps one batched call elsewhere.

Two kinds of test. In this process, at every device count (lowering only, fast): the CPU
program of a vmapped solve holds no LAPACK call of more than one matrix, and its CUDA program
still solves the batch in one call. In processes of their own, once per suite (the 4-device
run), with 2 and 4 devices of their own: the sizes and batch of the report, where the batched
kernels hung most runs, solve, repeated, within a time limit that fails a hang instead of
stalling the suite.
"""

import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from matrices import several_devices_mesh

import jaxmg

BATCH = 3
#: Seconds a process of the solves below may take (on a 2-core machine shared with other test
#: runs they took 55 to 85 s); a hang exceeds it.
LIMIT = 300


def _solves(mesh):
    """``potrs``, ``lu_solve`` after ``lu_factor`` and ``syevd`` on backend ``"jax"``, of one
    matrix each (vmapped by the tests)."""
    return {
        "potrs": lambda a, b: jaxmg.potrs(a, b, mesh=mesh, backend="jax"),
        "lu_solve": lambda a, b: jaxmg.lu_solve(
            jaxmg.lu_factor(a, mesh=mesh, backend="jax"), b, backend="jax"
        ),
        "syevd": lambda a, b: jaxmg.syevd(a, mesh=mesh, backend="jax"),
    }


def _factorizations(text, targets):
    """``[(op, first operand's shape)]`` of StableHLO ``text``'s ops named by the regular
    expression ``targets`` (custom calls' targets, or ``stablehlo.triangular_solve``)."""
    found = []
    for line in text.splitlines():
        op = re.search(rf"[@\"]({targets})[\"(].* : \(tensor<([\dx]*)[a-z]", line)
        if op:
            found.append((op.group(1), tuple(int(d) for d in op.group(2).split("x") if d)))
    return found


def _arguments(mesh, n):
    a = jax.ShapeDtypeStruct(
        (BATCH, n, n), jnp.float64, sharding=NamedSharding(mesh, P(None, "x", None))
    )
    b = jax.ShapeDtypeStruct((BATCH, n), jnp.float64, sharding=NamedSharding(mesh, P()))
    return a, b


@pytest.mark.parametrize("routine", ["potrs", "lu_solve", "syevd"])
def test_vmapped_cpu_programs_call_lapack_one_matrix_at_a_time(routine):
    if jax.default_backend() != "cpu":
        pytest.skip("reads the CPU programs of the suite's devices")
    mesh = several_devices_mesh()
    n = 16 * mesh.size
    fn = jax.jit(jax.vmap(_solves(mesh)[routine]))
    calls = _factorizations(fn.trace(*_arguments(mesh, n)).lower().as_text(), r"lapack_\w+")
    # syevd's: Jacobi's eigh (under vmap the fallback's lax.cond runs both of its branches)
    assert calls
    assert all(len(shape) == 2 for _, shape in calls), calls


@pytest.mark.parametrize("routine", ["potrs", "lu_solve"])
def test_vmapped_cuda_programs_solve_the_batch_in_one_call(routine):
    """Lowered for CUDA (on this machine), the same programs keep cuSOLVER's batched calls and
    XLA's batched triangular solves."""
    mesh = jax.sharding.AbstractMesh(
        (max(jax.device_count(), 2),), ("x",), axis_types=(AxisType.Explicit,),
        abstract_device=jax.sharding.AbstractDevice("gpu", None, "cuda"),
    )  # fmt: skip
    fn = jax.jit(jax.vmap(_solves(mesh)[routine]))
    text = fn.trace(*_arguments(mesh, 16 * mesh.size)).lower(lowering_platforms=("cuda",))
    calls = _factorizations(text.as_text(), r"cusolver_\w+|stablehlo\.triangular_solve")
    ops = {op.split("_")[0] for op, _ in calls}
    assert ops == {"cusolver", "stablehlo.triangular"}, calls
    assert all(shape[0] == BATCH and len(shape) == 3 for _, shape in calls), calls


CHILD = textwrap.dedent(
    """
    import sys
    import jax
    jax.config.update("jax_num_cpu_devices", int(sys.argv[1]))
    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import jaxmg

    n, repeats = int(sys.argv[2]), int(sys.argv[3])
    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    rng = np.random.default_rng(0)
    g = rng.standard_normal(({batch}, n, n))
    a = g @ g.transpose(0, 2, 1) / n + np.eye(n)
    b = rng.standard_normal(({batch}, n))
    a_x = jax.device_put(a, NamedSharding(mesh, P(None, "x", None)))
    b_x = jax.device_put(b, NamedSharding(mesh, P()))
    solves = {{
        "potrs": lambda a, b: jaxmg.potrs(a, b, backend="jax"),
        "lu_solve": lambda a, b: jaxmg.lu_solve(jaxmg.lu_factor(a, backend="jax"), b),
    }}
    for name in sys.argv[4:]:
        solve = jax.jit(jax.vmap(solves[name]))
        for _ in range(repeats):
            x = np.asarray(solve(a_x, b_x))
            worst = max(
                np.linalg.norm(a[i] @ x[i] - b[i])
                / (np.linalg.norm(a[i], 1) * np.linalg.norm(x[i]) * n * np.finfo(float).eps)
                for i in range({batch})
            )
            print(name, worst, flush=True)
    """
).format(batch=BATCH)


def _run(devices, n, repeats, routines):
    """The worst scaled residual of each routine's runs, from a process of ``devices`` CPU
    devices; fails where the process hangs past :data:`LIMIT` or exits with an error."""
    command = [sys.executable, "-c", CHILD, str(devices), str(n), str(repeats), *routines]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=LIMIT,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
        )
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"hung: no result in {LIMIT} s; output so far: {hung.stdout!r}")
    assert done.returncode == 0, done.stderr[-3000:]
    worst = {}
    for line in done.stdout.splitlines():
        name, value = line.split()
        worst[name] = max(worst.get(name, 0.0), float(value))
    assert sorted(worst) == sorted(routines), done.stdout
    return worst


@pytest.mark.usefixtures("once_per_suite")
@pytest.mark.parametrize(
    ("devices", "n", "repeats"),
    [(4, 512, 2), (2, 1024, 1)],
    ids=["4dev-512", "2dev-1024"],
)
def test_vmapped_solves_of_the_report_finish(devices, n, repeats):
    """``jax.jit(jax.vmap(potrs))`` and ``lu_solve`` of 3 matrices sharded ``P(None, "x",
    None)``: before the engine called LAPACK one matrix at a time, most of these processes
    hung (N = 512 on 4 devices: 13 of 18; N = 1024: 2 of 2)."""
    worst = _run(devices, n, repeats, ["potrs", "lu_solve"])
    assert all(value < 30.0 for value in worst.values()), worst
