"""Fit a Gaussian process's length scale, signal and noise by gradient descent with jaxmg.

The kernel matrix K (N x N) is sharded over the devices by columns; each step evaluates the
negative log marginal likelihood ``0.5 y^T K^-1 y + 0.5 log det K + N/2 log 2 pi`` and its
gradient with respect to the hyperparameters through jaxmg.potrs(..., return_logdet=True):
one Cholesky factorisation per step, whose factor the backward pass reuses.

Runs on GPUs when there are any, otherwise on 2 simulated CPU devices (the LAPACK twin).
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
mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)
jax.set_mesh(mesh)  # the data below lives on it, replicated unless said otherwise
columns = NamedSharding(mesh, P(None, "x"))

# Noisy observations of a smooth function.
N = 128
rng = np.random.default_rng(0)
points = jnp.asarray(np.sort(rng.uniform(-3, 3, N)))
y = jnp.asarray(np.sin(2 * np.asarray(points)) + 0.1 * rng.standard_normal(N))


def kernel(theta, x):
    """Squared-exponential kernel plus noise; theta = log(length, signal, noise)."""
    length, signal, noise = jnp.exp(theta)
    distance2 = (x[:, None] - x[None, :]) ** 2
    return signal**2 * jnp.exp(-0.5 * distance2 / length**2) + noise**2 * jnp.eye(x.shape[0])


def loss(theta):
    K = jax.sharding.reshard(kernel(theta, points), columns)  # sharded by columns
    alpha, logdet = jaxmg.potrs(K, y, return_logdet=True)
    return 0.5 * y @ alpha + 0.5 * logdet + 0.5 * N * jnp.log(2 * jnp.pi)


def single_device_loss(theta):
    K = kernel(theta, points)
    factor = jax.scipy.linalg.cho_factor(K, lower=True)
    alpha = jax.scipy.linalg.cho_solve(factor, y)
    logdet = 2 * jnp.sum(jnp.log(jnp.diag(factor[0])))
    return 0.5 * y @ alpha + 0.5 * logdet + 0.5 * N * jnp.log(2 * jnp.pi)


step = jax.jit(jax.value_and_grad(loss))
theta = jnp.log(jnp.array([2.0, 0.5, 0.5]))  # a poor start
# Adam: gradient descent with per-parameter step sizes.
rate, beta1, beta2 = 0.05, 0.9, 0.999
m = v = jnp.zeros_like(theta)
losses = []
for i in range(1, 81):
    value, grad = step(theta)
    losses.append(float(value))
    if i % 10 == 1:
        length, signal, noise = np.exp(np.asarray(theta))
        print(f"step {i:2d}  loss {float(value):9.3f}  length {length:.3f}  noise {noise:.3f}")
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad**2
    theta = theta - rate * (m / (1 - beta1**i)) / (jnp.sqrt(v / (1 - beta2**i)) + 1e-8)
length, signal, noise = np.exp(np.asarray(theta))
print(f"final    loss {losses[-1]:9.3f}  length {length:.3f}  noise {noise:.3f}")
print(losses[-1] < losses[0] - 100)  # the fit improved
# The same gradient as JAX's single-device Cholesky, on the same data.
_, reference = jax.value_and_grad(single_device_loss)(theta)
print(bool(jnp.allclose(step(theta)[1], reference, rtol=1e-8, atol=1e-8)))
