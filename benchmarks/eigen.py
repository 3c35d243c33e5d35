"""Backend ``"jax"``'s eigensolver on several devices (Householder tridiagonalisation, bisection
and inverse iteration, ``jaxmg.engines.tridiagonal``) against LAPACK's ``?syevd`` (numpy's
``eigh``) and backend ``"mg"`` (the LAPACK twin) in the same run, float64, ``A`` sharded by
columns (issue 48's targets).

- ``accuracy``: ``||A V - V diag(w)||_F / ||A||_F`` and ``||V^H V - I||_F`` of the engine and of
  LAPACK on the same matrix, and their ratios, for random spectra of condition 1 to 1e12
  (uniform in ``[-1, 1]`` scaled to the condition, geometric, and clustered: multiplicities of
  8 and ``I`` plus rank 2);
- ``time``: ``syevd`` of a random symmetric ``N x N`` by ``"jax"`` against ``"mg"`` (the best of
  ``--repeat`` warm runs, each jitted), and ``lstsq`` of a random full-rank ``M x K`` by
  ``"jax"`` against ``jnp.linalg.lstsq`` on one device;
- memory per device: ``benchmarks/memory.py --backend jax --routines syevd`` (XLA's analysis).

    python benchmarks/eigen.py --cpu-devices 4 --what accuracy --n 512
    python benchmarks/eigen.py --cpu-devices 4 --what time --n 2048
"""

from __future__ import annotations

import argparse
import json
import time

from _common import timed


def spectra(n, rng):
    """Name -> eigenvalues, ascending or not."""
    import numpy as np

    out = {}
    for cond in (1.0, 1e4, 1e8, 1e12):
        signs = np.where(rng.random(n) < 0.5, -1.0, 1.0)
        out[f"geometric, cond {cond:.0e}"] = signs * np.logspace(0, -np.log10(cond), n)
        if cond > 1:
            out[f"uniform, cond {cond:.0e}"] = np.concatenate(
                [[1.0, 1.0 / cond], rng.uniform(1.0 / cond, 1.0, n - 2)]
            ) * np.where(rng.random(n) < 0.5, -1.0, 1.0)
    out["multiplicities of 8"] = np.repeat(np.arange(n // 8, dtype=float), 8)
    out["identity plus rank 2"] = np.concatenate([np.ones(n - 2), [5.0, -3.0]])
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--what", choices=("accuracy", "time"), default="accuracy")
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--lstsq", type=int, nargs=2, default=(4096, 1024), metavar=("M", "K"))
    p.add_argument("--cpu-devices", type=int, default=4)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)
    import jax

    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg

    mesh = jax.make_mesh((args.cpu_devices,), ("x",))
    rng = np.random.default_rng(0)
    n = args.n

    def sharded(a, spec=None):
        return jax.device_put(a, NamedSharding(mesh, P(None, "x") if spec is None else spec))

    def measures(a, w, v):
        return (
            float(np.linalg.norm(a @ v - v * w) / np.linalg.norm(a)),
            float(np.linalg.norm(v.T @ v - np.eye(len(w)))),
        )

    if args.what == "accuracy":
        solve = jax.jit(lambda a: jaxmg.syevd(a, backend="jax"))
        for name, values in spectra(n, rng).items():
            q, _ = np.linalg.qr(rng.standard_normal((n, n)))
            a = (q * values) @ q.T
            a = (a + a.T) / 2
            w, v = (np.asarray(x) for x in solve(sharded(a)))
            lw, lv = np.linalg.eigh(a)
            ours, lapack = measures(a, w, v), measures(a, lw, lv)
            row = {
                "spectrum": name,
                "n": n,
                "devices": args.cpu_devices,
                "residual": ours[0],
                "lapack_residual": lapack[0],
                "residual_ratio": round(ours[0] / lapack[0], 2),
                "orthogonality": ours[1],
                "lapack_orthogonality": lapack[1],
                "orthogonality_ratio": round(ours[1] / lapack[1], 2),
                "eigenvalue_error": float(np.max(np.abs(w - lw)) / np.max(np.abs(lw))),
            }
            print(json.dumps(row), flush=True)
        return

    g = rng.standard_normal((n, n))
    a = sharded((g + g.T) / 2)
    times = {}
    for backend in ("mg", "jax"):
        f = jax.jit(lambda a, backend=backend: jaxmg.syevd(a, backend=backend))
        start = time.perf_counter()
        compiled = f.lower(a).compile()
        compile_s = time.perf_counter() - start
        best = timed(compiled, (a,), args.repeat, warmup=1)[1]
        times[backend] = {"compile_s": round(compile_s, 2), "run_s": round(best, 3)}
    row = {"routine": "syevd", "n": n, "devices": args.cpu_devices, **times}
    row["jax_over_mg"] = round(times["jax"]["run_s"] / times["mg"]["run_s"], 2)
    print(json.dumps(row), flush=True)

    m, k = args.lstsq
    x = rng.standard_normal((m, k))
    b = rng.standard_normal((m, 1))
    ours = jax.jit(lambda x, b: jaxmg.lstsq(x, b, backend="jax")[0])
    theirs = jax.jit(lambda x, b: jnp.linalg.lstsq(x, b)[0])
    inputs = {"jax": (sharded(x, P("x", None)), sharded(b, P())), "one device": (x, b)}
    times = {}
    for label, f in (("jax", ours), ("one device", theirs)):
        times[label] = round(timed(f, inputs[label], args.repeat, warmup=1)[1], 3)
    row = {"routine": "lstsq", "m": m, "k": k, "devices": args.cpu_devices, "run_s": times}
    row["jax_over_one_device"] = round(times["jax"] / times["one device"], 2)
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
