"""Invert a sharded Hermitian positive definite matrix with jaxmg.potri and check A @ inv(A).

Runs on GPUs when there are any, otherwise on 2 simulated CPU devices (the LAPACK twin).
"""

import jax

jax.config.update("jax_num_cpu_devices", 2)  # only used when there is no GPU
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from jaxmg import potri  # noqa: E402

try:
    devices = jax.devices("gpu")[:2]
except RuntimeError:
    devices = jax.devices("cpu")[:2]
N = 64
T_A = 8
ndev = len(devices)
mesh = jax.make_mesh((ndev,), ("x",), devices=devices)
M = jax.random.normal(jax.random.key(0), (N, N), dtype=jnp.float64)
A = M @ M.T / N + jnp.eye(N, dtype=jnp.float64)
A = jax.device_put(A, NamedSharding(mesh, P(None, "x")))
A_inv, status = potri(A, T_A, return_status=True)
print(f"Status: {status}")
print(A_inv.sharding)
print(np.allclose(np.asarray(A) @ np.asarray(A_inv), np.eye(N), atol=1e-10))
