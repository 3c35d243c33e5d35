"""Backend ``"jax"`` on several devices (the Cholesky of XLA's collectives) against backend
``"mg"`` (the LAPACK twin on CPUs) in the same run: ``potrs`` of an ``N x N`` float64 ``A``
sharded by rows, jitted; compile time, the best of ``--repeat`` warm runs, the ratio of times,
and XLA's memory analysis per device in blocks of ``A`` (temporaries; arguments are one block).

    python benchmarks/collectives.py --cpu-devices 4 --n 1024 2048
"""

from __future__ import annotations

import argparse
import json
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", nargs="+", type=int, default=[1024, 2048])
    p.add_argument("--tile", type=int, default=None, help="T_A (default: each engine's own)")
    p.add_argument("--cpu-devices", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    import jax

    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg

    mesh = jax.make_mesh((args.cpu_devices,), ("x",))
    for n in args.n:
        m = np.random.default_rng(0).standard_normal((n, n))
        a = m @ m.T / n + np.eye(n)
        A = jax.device_put(a, NamedSharding(mesh, P("x", None)))
        b = jnp.ones(n)
        block = n * n * 8 / args.cpu_devices
        rows = {}
        for backend in ("mg", "jax"):
            f = jax.jit(lambda A, b, backend=backend: jaxmg.potrs(A, b, args.tile, backend=backend))
            start = time.perf_counter()
            compiled = f.lower(A, b).compile()
            compile_s = time.perf_counter() - start
            x = np.asarray(compiled(A, b))
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                compiled(A, b).block_until_ready()
                times.append(time.perf_counter() - start)
            memory = compiled.memory_analysis()
            rows[backend] = {
                "compile_s": round(compile_s, 2),
                "run_s": round(min(times), 4),
                "temp_blocks": round(memory.temp_size_in_bytes / block, 2),
                "residual": float(
                    np.linalg.norm(a @ x - 1) / (np.linalg.norm(a) * np.linalg.norm(x))
                ),
            }
        ratio = rows["jax"]["run_s"] / rows["mg"]["run_s"]
        print(
            json.dumps(
                {"n": n, "devices": args.cpu_devices, **rows, "jax_over_mg": round(ratio, 2)}
            )
        )


if __name__ == "__main__":
    main()
