"""``python -m jaxmg demo``: solve one random Hermitian positive definite system.

The demo is a program, not the library: it may configure JAX for its own process. It asks for
4 simulated CPU devices (used only when no GPU is visible) and enables x64 for float64.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import time


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m jaxmg", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="solve A x = b with jaxmg.potrs on every device")
    demo.add_argument("--n", type=int, default=2048, help="matrix size N (default 2048)")
    demo.add_argument(
        "--tile", type=int, default=None, help="tile size T_A (default: jaxmg chooses)"
    )
    demo.add_argument(
        "--dtype",
        default="float64",
        choices=["float32", "float64", "complex64", "complex128"],
    )
    demo.add_argument(
        "--cpu-devices", type=int, default=4, help="simulated CPU devices without a GPU"
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    import jax

    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    jax.config.update("jax_enable_x64", True)
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg

    devices = jax.devices()
    mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)
    n, dtype = args.n - args.n % len(devices), np.dtype(args.dtype)

    rng = np.random.default_rng(0)
    m = rng.standard_normal((n, n))
    if dtype.kind == "c":
        m = m + 1j * rng.standard_normal((n, n))
    a_host = (m @ m.conj().T / n + np.eye(n)).astype(dtype)
    b_host = rng.standard_normal((n, 1)).astype(dtype)
    a = jax.device_put(a_host, NamedSharding(mesh, P(None, "x")))
    b = jax.device_put(b_host, NamedSharding(mesh, P()))

    jax.block_until_ready(jaxmg.potrs(a, b, T_A=args.tile, return_status=True))  # compile
    start = time.perf_counter()
    x, status = jaxmg.potrs(a, b, T_A=args.tile, return_status=True)
    x.block_until_ready()
    elapsed = time.perf_counter() - start

    x_host = np.asarray(x)
    eps = np.finfo(dtype).eps
    residual = np.linalg.norm(a_host @ x_host - b_host) / (
        np.linalg.norm(a_host, 1) * np.linalg.norm(x_host) * n * eps
    )
    backend = "cuSolverMg" if devices[0].platform == "gpu" else "LAPACK CPU twin"
    print(f"jaxmg {importlib.metadata.version('jaxmg')} potrs demo")
    tile = "automatic" if args.tile is None else args.tile
    print(f"  N = {n}, T_A = {tile}, dtype = {dtype.name}")
    print(f"  devices: {len(devices)} x {devices[0].device_kind} ({backend})")
    print(f"  status = {int(status)}, time = {elapsed * 1e3:.1f} ms")
    print(f"  scaled residual ||Ax-b|| / (||A|| ||x|| N eps) = {residual:.3g} (passes if < 30)")
    return 0 if residual < 30 and int(status) == 0 else 1
