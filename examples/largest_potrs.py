"""The largest potrs that fits a per-device memory budget, with A given up to the solver.

On 4 simulated CPU devices (or the GPUs, when there are 4), for a budget per device (default
8 MiB; ``python examples/largest_potrs.py 32`` for 32 MiB): the largest N whose program fits,
by XLA's memory analysis of the compiled program (arguments + outputs - aliased +
temporaries, per device), for

- jaxmg with A sharded by rows and donated: the Cholesky factor takes over A's own buffer;
- JAX's own ``cho_factor`` + ``cho_solve`` on one device, with A donated too.

Then it solves the largest jaxmg N with ``potrs(..., donate=True)`` and checks the solution.
Memory the native call takes from the library's workspace while it runs is not in XLA's
analysis.
"""

import sys
import warnings

import jax

jax.config.update("jax_num_cpu_devices", 4)  # only used when there is no GPU
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import jax.scipy.linalg as jsl  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jaxmg  # noqa: E402

budget = float(sys.argv[1] if len(sys.argv) > 1 else 8) * 2**20
try:
    devices = jax.devices("gpu")[:4]
except RuntimeError:
    devices = jax.devices("cpu")[:4]
ndev = len(devices)
mesh = jax.make_mesh((ndev,), ("x",), devices=devices)
rows = NamedSharding(mesh, P("x", None))
STEP = 16 * ndev
# JAX's cho_factor + cho_solve has no result of A's shape: XLA cannot use its donated A.
warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


def program_bytes(fn, *args):
    m = jax.jit(fn, donate_argnums=0).lower(*args).compile().memory_analysis()
    return (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + (m.temp_size_in_bytes)
    )


def jaxmg_bytes(n):
    """A donated: the factor (returned, in A's buffer) and the solution, in one program."""
    a = jax.ShapeDtypeStruct((n, n), jnp.float64, sharding=rows)
    b = jax.ShapeDtypeStruct((n, 1), jnp.float64, sharding=NamedSharding(mesh, P()))

    def solve(a, b):
        factor = jaxmg.cho_factor(a, mesh=mesh, in_specs=P("x", None))
        return jaxmg.cho_solve(factor, b), factor.factor

    return program_bytes(solve, a, b)


def jax_bytes(n):
    one = jax.sharding.SingleDeviceSharding(devices[0])
    a = jax.ShapeDtypeStruct((n, n), jnp.float64, sharding=one)
    b = jax.ShapeDtypeStruct((n, 1), jnp.float64, sharding=a.sharding)
    return program_bytes(lambda a, b: jsl.cho_solve(jsl.cho_factor(a, lower=True), b), a, b)


def largest(bytes_of):
    """The largest multiple of STEP whose program fits the budget (memory grows with N)."""
    lo, hi = 0, STEP
    while bytes_of(hi) <= budget:
        lo, hi = hi, 2 * hi
    while hi - lo > STEP:
        mid = (lo + hi) // 2 // STEP * STEP
        lo, hi = (mid, hi) if bytes_of(mid) <= budget else (lo, mid)
    return lo


n_jaxmg, n_jax = largest(jaxmg_bytes), largest(jax_bytes)
peak = jaxmg_bytes(n_jaxmg)
print(f"budget per device: {budget / 2**20:.1f} MiB on {ndev} devices")
print(f"jaxmg, A donated:   N = {n_jaxmg} ({peak / 2**20:.1f} MiB per device)")
print(f"JAX, one device:    N = {n_jax} ({jax_bytes(n_jax) / 2**20:.1f} MiB)")

rng = np.random.default_rng(0)
m = rng.standard_normal((n_jaxmg, n_jaxmg)) / np.sqrt(n_jaxmg)
m = m @ m.T + np.eye(n_jaxmg)
rhs = rng.standard_normal((n_jaxmg, 1))
A = jax.device_put(m, rows)
x = jaxmg.potrs(A, jnp.asarray(rhs), donate=True)  # A's buffer becomes the factor
residual = np.linalg.norm(m @ np.asarray(x) - rhs) / np.linalg.norm(rhs)
print(A.is_deleted() and residual < 1e-10 and n_jaxmg >= 1.5 * n_jax)
