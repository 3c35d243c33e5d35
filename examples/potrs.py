"""The README's example: solve diag(1..N) x = 1 with A sharded by rows over every device.

Runs on the GPUs when there are any, otherwise on 2 simulated CPU devices; needs no argument
but A and b: the tile, the mesh and A's sharding are chosen or read from A. The README shows
this program's code (tests/api/test_examples.py keeps the two the same); jaxmg 0.0.x's form of
the call is in docs/migration.md.
"""

import jax

jax.config.update("jax_num_cpu_devices", 2)  # simulated devices, used only without a GPU
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jaxmg  # noqa: E402

mesh = jax.make_mesh((jax.device_count(),), ("x",))  # every device, on one axis
N = 6 * mesh.size
A = jnp.diag(jnp.arange(1.0, N + 1))  # Hermitian positive definite
A = jax.device_put(A, NamedSharding(mesh, P("x", None)))  # rows; or columns: P(None, "x")
b = jnp.ones(N)
x = jaxmg.potrs(A, b)  # no tile, mesh or specs: chosen, or read from A
print(jnp.allclose(x, 1.0 / jnp.arange(1.0, N + 1)))
