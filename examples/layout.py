"""The original README's layout example: diag(1..12) in the 1D block-cyclic layout, T_A=2.

Prints each device's shard: on two devices, device 0 holds columns 0,1,4,5,8,9 and device 1
holds columns 2,3,6,7,10,11.
"""

import jax

jax.config.update("jax_num_cpu_devices", 2)  # only used when there is no GPU
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from jaxmg import cyclic_1d_layout  # noqa: E402

try:
    devices = jax.devices("gpu")[:2]
except RuntimeError:
    devices = jax.devices("cpu")[:2]
N = 12
T_A = 2
dtype = jnp.float32
ndev = len(devices)
# Create diagonal matrix
A = jnp.diag(jnp.arange(N, dtype=dtype) + 1)
mesh = jax.make_mesh((ndev,), ("x",), devices=devices)
A = jax.device_put(A, NamedSharding(mesh, P(None, "x")))
A_bc = cyclic_1d_layout(A, T_A)

for shard in sorted(A_bc.addressable_shards, key=lambda s: s.index[1].start or 0):
    print(f"dev {shard.device.id}: shard\n {shard.data}")
