"""Every routine's values and derivatives in ONE jitted program, on 4 CPU devices.

Such a program holds many jaxmg calls and many XLA collectives that do not depend on each
other. XLA:CPU runs independent operations concurrently, each device in an order of its own,
on a pool of about one thread per device, and its collectives block their thread until every
device has joined. A jaxmg handler that blocked its thread while waiting for the other devices
could hold the thread another device needed: the program stalled and XLA aborted the process
after 40 s (4 devices, 3 runs of 3 before the CPU handlers returned an ``ffi::Future``,
csrc/meeting/rendezvous.h). Run in a process of its own, so that an abort fails this test and
not the suite; the deadline guards against a hang and is far beyond the run's time.
"""

import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("once_per_suite")

PROGRAM = r"""
import sys
import jax
jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import numpy as np
sys.path.insert(0, sys.argv[1])
import test_grad_matrix as matrix

n = matrix.size()
args = matrix.data(n)
rng = np.random.default_rng(7)
tangents = tuple(rng.standard_normal(np.shape(a)) for a in args)
mesh = jax.make_mesh((4,), ("x",))
kw = dict(mesh=mesh, in_specs=matrix.FORMS[sys.argv[2]])
ours, theirs = [], []
for name, (which, with_b, fn) in matrix.routines(kw).items():
    reference = matrix.references()[name]
    mine = matrix.operands(args, which, with_b)
    weights = tuple(rng.standard_normal(np.shape(o)) for o in reference(*mine))
    directions = matrix.operands(tangents, which, with_b)
    ours.append((matrix.values_and_derivatives(fn, directions, weights), which, with_b))
    theirs.append((matrix.values_and_derivatives(reference, directions, weights), which, with_b))


def everything(runs):
    def run(h, g, b):
        return [f(*matrix.operands((h, g, b), which, with_b)) for f, which, with_b in runs]

    return jax.jit(run)


want = everything(theirs)(*map(jnp.asarray, args))
program = everything(ours)
for _ in range(5):
    matrix.close(program(*map(jnp.asarray, args)), want, "one program")
print("True")
"""


@pytest.mark.parametrize("form", ["cols", "rows"])
def test_every_routine_and_derivative_in_one_program(form):
    env = dict(os.environ, JAXMG_TIMEOUT_S="60")
    env.pop("XLA_FLAGS", None)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(pathlib.Path(__file__).parent), form],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().splitlines()[-1] == "True", done.stdout
