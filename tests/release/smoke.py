"""What a user of a release runs first: every public routine once, from the installed wheels.

``nox -s wheels`` runs this script with a fresh virtual environment's Python that has only the
three wheels (and what they depend on) installed, from a folder outside the checkout, so that
nothing is imported from the source tree. Two simulated CPU devices; each routine against
numpy. Prints one line per check and a closing ``N passed`` (``N passed, M failed``, exit 1, on
a failure).
"""

import sys

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jaxmg  # noqa: E402

if "/packages/" in jaxmg.__file__ or "site-packages" not in jaxmg.__file__:
    sys.exit(f"jaxmg was imported from {jaxmg.__file__}, not from an installed wheel")

mesh = jax.make_mesh((2,), ("x",))
n = 16
rng = np.random.default_rng(0)
g = rng.standard_normal((2 * n, n))
spd = g.T @ g / n + np.eye(n)
gen = rng.standard_normal((n, n)) + n * np.eye(n)
b = rng.standard_normal(n)
y = rng.standard_normal(2 * n)


def rows(a):
    return jax.device_put(a, NamedSharding(mesh, P("x", None)))


A, G, T = rows(spd), rows(gen), rows(g)
checks = {
    "potrs": lambda: np.allclose(jaxmg.potrs(A, jnp.asarray(b)), np.linalg.solve(spd, b)),
    "potri": lambda: np.allclose(jaxmg.potri(A), np.linalg.inv(spd)),
    "syevd": lambda: np.allclose(jaxmg.syevd(A)[0], np.linalg.eigvalsh(spd)),
    "cho_solve": lambda: np.allclose(
        jaxmg.cho_solve(jaxmg.cho_factor(A), jnp.asarray(b)), np.linalg.solve(spd, b)
    ),
    "lu_solve": lambda: np.allclose(
        jaxmg.lu_solve(jaxmg.lu_factor(G), jnp.asarray(b)), np.linalg.solve(gen, b)
    ),
    "svd": lambda: np.allclose(jaxmg.svd(T, compute_uv=False), np.linalg.svd(g, compute_uv=False)),
    "qr": lambda: np.allclose(np.matmul(*jaxmg.qr(T)), g),
    "polar": lambda: np.allclose(np.matmul(*jaxmg.polar(T)), g),
    "lstsq": lambda: np.allclose(
        jaxmg.lstsq(T, jnp.asarray(y))[0], np.linalg.lstsq(g, y, rcond=None)[0]
    ),
    "gesvd (1.x)": lambda: np.allclose(
        jaxmg.gesvd(T, 4, compute_u=False, compute_vh=False), np.linalg.svd(g, compute_uv=False)
    ),
    "least_squares (1.x)": lambda: np.allclose(
        jaxmg.least_squares(T, jnp.asarray(y), 4), np.linalg.lstsq(g, y, rcond=None)[0]
    ),
    "potrs_shardmap_ctx (1.x)": lambda: np.allclose(
        jaxmg.potrs_shardmap_ctx(A, jnp.asarray(b), 4)[1], np.linalg.solve(spd, b)
    ),
    "grad of potrs": lambda: np.allclose(
        jax.jit(jax.grad(lambda a: jnp.sum(jaxmg.potrs(a, jnp.asarray(b)))))(A),
        jax.grad(lambda a: jnp.sum(jnp.linalg.solve((a + a.T) / 2, b)))(spd),
    ),
}
failed = 0
for name, check in checks.items():
    try:
        ok = bool(check())
    except Exception as error:  # a release must not raise here: report it as a failure
        ok = False
        print(f"{name}: {type(error).__name__}: {error}")
    failed += not ok
    print(f"{name}: {'ok' if ok else 'FAILED'}")
# pytest's form (.ci/run reads it): "N passed", or "N passed, M failed"
print(f"{len(checks) - failed} passed" + (f", {failed} failed" if failed else ""))
sys.exit(1 if failed else 0)
