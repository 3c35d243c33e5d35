"""Eigenvalues and eigenvectors of a sharded Hermitian matrix with jaxmg.syevd.

Runs on GPUs when there are any, otherwise on 2 simulated CPU devices (the LAPACK twin).
"""

import jax

jax.config.update("jax_num_cpu_devices", 2)  # only used when there is no GPU
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from jaxmg import syevd  # noqa: E402

try:
    devices = jax.devices("gpu")[:2]
except RuntimeError:
    devices = jax.devices("cpu")[:2]
N = 64
T_A = 8
ndev = len(devices)
mesh = jax.make_mesh((ndev,), ("x",), devices=devices)
M = jax.random.normal(jax.random.key(0), (N, N), dtype=jnp.complex128)
A = (M + M.conj().T) / 2
A = jax.device_put(A, NamedSharding(mesh, P(None, "x")))
w, V = syevd(A, T_A)
print("lowest eigenvalues:", w[:3])
A_host, V_host, w_host = np.asarray(A), np.asarray(V), np.asarray(w)
print(np.allclose(w_host, np.linalg.eigvalsh(A_host)))
print(np.allclose(A_host @ V_host, V_host * w_host[None, :], atol=1e-10))
