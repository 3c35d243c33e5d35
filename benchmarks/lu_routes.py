"""What solving with ``A^T`` costs on backend ``"mg"``, whose engine solves only with its factor.

cuSolverMg's ``getrs`` takes ``CUBLAS_OP_N`` alone, so ``jaxmg.lu_solve(..., trans=1 or 2)``
first builds the factor of ``A^T P`` from ``A``'s (one ``all_to_all`` of the factor, then a
scaling), and a row-sharded ``A`` is transposed before it is factored. This measures, on the
same matrix and in the same run: the factorisation of a column- and of a row-sharded ``A``, and
the solves with ``A``, ``A^T`` and ``A^H`` from one factor, against JAX's own ``lu_factor`` /
``lu_solve`` on one device; with each program's memory per device from XLA's memory analysis
(arguments + outputs + temporaries - aliased). Every solve is checked against numpy.

Example (4 simulated CPU devices):
    python benchmarks/lu_routes.py --cpu-devices 4 --n 1024 2048
"""

from __future__ import annotations

import argparse
import json
import pathlib

from _common import program_memory, timed


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", nargs="+", type=int, default=[2048])
    p.add_argument("--nrhs", type=int, default=1)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--cpu-devices", type=int, default=4, help="simulated CPU devices (no GPU)")
    p.add_argument("--json", type=pathlib.Path, help="write the JSON lines here")
    p.add_argument("--markdown", type=pathlib.Path, help="write the markdown table here")
    return p.parse_args(argv)


def memory_mib(fn, *args):
    """The compiled program's memory per device (XLA's analysis), MiB."""
    return program_memory(fn.lower(*args).compile()).get("program_bytes", float("nan")) / 2**20


def main(argv=None):
    args = parse(argv)
    import jax

    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg

    ndev = jax.device_count()
    mesh = jax.make_mesh((ndev,), ("x",))
    rows = []
    for n in args.n:
        rng = np.random.default_rng(0)
        a0 = rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)
        b0 = rng.standard_normal((n, args.nrhs))
        b = jnp.asarray(b0)
        one = jax.devices()[0]
        a_one = jax.device_put(a0, one)

        def record(case, seconds, mib, baseline=None, residual=None, n=n):
            row = dict(case=case, n=n, ndev=ndev, nrhs=args.nrhs, median_s=seconds[0])
            row.update(min_s=seconds[1], max_s=seconds[2], mib_per_device=mib)
            if baseline is not None:
                row.update(baseline_s=baseline[0], ratio=seconds[0] / baseline[0])
            if residual is not None:
                row["scaled_residual"] = residual
            print(json.dumps(row), flush=True)
            rows.append(row)

        base_factor = jax.jit(jax.scipy.linalg.lu_factor)
        base_time = timed(base_factor, (a_one,), args.runs, args.warmup)
        lu_one = base_factor(a_one)
        factors = {}
        for form, spec in (("cols", P(None, "x")), ("rows", P("x", None))):
            a = jax.device_put(a0, NamedSharding(mesh, spec))
            factor_fn = jax.jit(lambda a: jaxmg.lu_factor(a, backend="mg"))
            seconds = timed(factor_fn, (a,), args.runs, args.warmup)
            record(f"lu_factor, A by {form}", seconds, memory_mib(factor_fn, a), base_time)
            factors[form] = factor_fn(a)
        for trans, op in ((0, a0), (1, a0.T), (2, a0.conj().T)):
            base_solve = jax.jit(lambda lu, b, t=trans: jax.scipy.linalg.lu_solve(lu, b, trans=t))
            b_one = jax.device_put(b0, one)
            base = timed(base_solve, (lu_one, b_one), args.runs, args.warmup)
            for form, factor in factors.items():
                solve = jax.jit(lambda f, b, t=trans: jaxmg.lu_solve(f, b, trans=t))
                seconds = timed(solve, (factor, b), args.runs, args.warmup)
                x = np.asarray(solve(factor, b))
                eps = np.finfo(np.float64).eps
                residual = np.linalg.norm(op @ x - b0) / (
                    np.linalg.norm(op, 1) * np.linalg.norm(x) * n * eps
                )
                assert residual < 30, (form, trans, residual)
                mib = memory_mib(solve, factor, b)
                record(f"lu_solve trans={trans}, A by {form}", seconds, mib, base, residual)

    lines = [
        "| case | N | devices | jaxmg ms (min..max) | JAX one device ms | ratio | MiB/device |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['n']} | {r['ndev']} | {1e3 * r['median_s']:.1f} "
            f"({1e3 * r['min_s']:.1f}..{1e3 * r['max_s']:.1f}) | "
            f"{1e3 * r.get('baseline_s', float('nan')):.1f} | {r.get('ratio', float('nan')):.2f} "
            f"| {r['mib_per_device']:.0f} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.json:
        args.json.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if args.markdown:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
