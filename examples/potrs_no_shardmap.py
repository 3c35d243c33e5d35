"""The original README's shard_map example: shift the diagonal, then solve, in complex64.

Unchanged apart from the device list and ``check_vma``: it runs on GPUs when there are any,
otherwise on 2 simulated CPU devices (the LAPACK twin), and its ``shard_map`` keeps JAX's default
``check_vma=True`` (the original passed ``check_vma=False``, which works too).
"""

from functools import partial

import jax

jax.config.update("jax_num_cpu_devices", 2)  # only used when there is no GPU
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from jaxmg import potrs_no_shardmap  # noqa: E402

try:
    devices = jax.devices("gpu")[:2]
except RuntimeError:
    devices = jax.devices("cpu")[:2]
N = 8
T_A = 2
dtype = jnp.complex64
# Create diagonal matrix and `b` all equal to one
A = jnp.diag(jnp.arange(N, dtype=dtype) + 1)
b = jnp.ones((N, 1), dtype=dtype)
ndev = len(devices)
# Make mesh and place data (columns sharded)
mesh = jax.make_mesh((ndev,), ("x",), devices=devices)
A = jax.device_put(A, NamedSharding(mesh, P(None, "x")))
b = jax.device_put(b, NamedSharding(mesh, P(None, None)))
diag_shift = 1e-1


@partial(jax.jit, static_argnames=("_T_A",))
def shift_and_solve(_a, _b, _ds, _T_A):
    idx = jnp.arange(_a.shape[0])
    shard_size = _a.shape[1]
    # Add shift based on index.
    _a = _a.at[idx + shard_size * jax.lax.axis_index("x"), idx].add(_ds)
    jax.debug.print("dev{}:_a=\n{}\n", jax.lax.axis_index("x"), _a)
    # Call solver in shard_map context
    return potrs_no_shardmap(_a, _b, _T_A)


@partial(jax.jit, static_argnames=("_T_A",))
def jitted_potrs(_a, _b, _ds, _T_A):
    out = jax.shard_map(
        partial(shift_and_solve, _T_A=_T_A),
        mesh=mesh,
        in_specs=(P(None, "x"), P(None, None), P()),
        out_specs=(P(None, None), P(None)),
    )(_a, _b, _ds)
    return out


out, status = jitted_potrs(A, b, diag_shift, T_A)
print(f"Status: {status}")
expected_out = 1.0 / (jnp.arange(N, dtype=dtype) + 1 + diag_shift)
print(jnp.allclose(out.flatten(), expected_out))
