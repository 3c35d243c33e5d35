"""A program written for jaxmg 1.x (cuSOLVERMp), run here unchanged but for its processes.

jaxmg 1.x runs one process per GPU, the matrix over a ``(P, 1)`` grid of processes
``("pr", "pc")``, every routine called as ``f(a, [b,] T_A, ...)``. Here one process drives the
devices (two GPUs, or two simulated CPU devices when there is none); jaxmg solves that grid by
rows. Each line printed is one check (against numpy), ``True`` when it holds.
"""

import jax

jax.config.update("jax_num_cpu_devices", 2)  # only used when there is no GPU
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jaxmg  # noqa: E402

try:
    devices = jax.devices("gpu")[:2]
except RuntimeError:
    devices = jax.devices("cpu")[:2]

grid = jax.make_mesh((len(devices), 1), ("pr", "pc"), devices=devices)
tile = 4
n = tile * len(devices) * 2
rng = np.random.default_rng(0)
g = rng.standard_normal((2 * n, n))
spd = g.T @ g / n + np.eye(n)
rhs = rng.standard_normal((n, 3))

with jax.set_mesh(grid):
    A = jax.device_put(spd, NamedSharding(grid, P("pr", "pc")))
    b = jax.device_put(rhs, NamedSharding(grid, P("pr", None)))
    x, logdet = jaxmg.potrs(A, b, tile, return_logdet=True)
    print(np.allclose(x, np.linalg.solve(spd, rhs)))
    print(np.isclose(logdet, np.linalg.slogdet(spd)[1]))

    tall = jax.device_put(g, NamedSharding(grid, P("pr", "pc")))
    u, s, vh = jaxmg.gesvd(tall, tile)
    print(np.allclose((u * s) @ vh, g))
    print(np.allclose(s, np.linalg.svd(g, compute_uv=False)))

    y = jnp.asarray(rng.standard_normal(2 * n))
    x_ls = jaxmg.least_squares(tall, y, tile)
    print(np.allclose(x_ls, np.linalg.lstsq(g, np.asarray(y), rcond=None)[0]))

    # The *_shardmap_ctx twins keep their inputs and always return the status, whose word 0
    # is 0 on success.
    a_work, w, v, status = jaxmg.syevd_shardmap_ctx(A, tile)
    print(np.allclose(w, np.linalg.eigvalsh(spd)))
    print(int(status[0]) == 0 and not A.is_deleted())
