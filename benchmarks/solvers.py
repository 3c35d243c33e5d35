"""Benchmark jaxmg's potrs / potri / syevd / lu_solve / cho_factor + cho_solve against JAX's
own linear algebra on one device.

For every case (routine x N x dtype x T_A x device count x backend) the same matrix is solved by
jaxmg on ``ndev`` devices and by the single-device JAX baseline (``cho_factor`` + ``cho_solve``,
``jnp.linalg.inv``, ``jnp.linalg.eigh``/``eigvalsh``, ``jnp.linalg.solve``) in the same run.
Each timing is ``--warmup`` untimed runs then ``--runs`` timed runs ending in
``block_until_ready``, jaxmg's and the baseline's alternating (so that a shared machine's
drifting speed slows both alike); the median and the spread (min..max) are reported, the ratio
of the medians and the median and spread of the per-run ratios, with TFLOP/s from the standard
flop counts:

    potrs, cho_solve: N^3/3 (potrf) + 2 N^2 nrhs      potri: N^3/3 (potrf) + 2 N^3/3
    syevd (values): 4 N^3/3                             syevd (vectors): 4 N^3
    lu_solve: 2 N^3/3 (getrf) + 2 N^2 nrhs              complex dtypes: 4x the real count.

``--backends default mg``: jaxmg's automatic engine (on one device, JAX's own dense solvers)
and ``backend="mg"`` (cuSolverMg, or its LAPACK twin on CPUs), each against the baseline.
``--tiles 0`` is ``T_A=None`` (jaxmg chooses).

Every case is checked (scaled residual < 30) so a fast wrong answer cannot pass. Memory, for
jaxmg and for the baseline: the compiled program's memory analysis per device (arguments +
outputs + temporaries - aliased; the native targets' workspace is not in it); on GPU also the
device's peak bytes in use, read after jaxmg's runs and before the baseline's (a peak over the
process so far: run one case per process for a clean figure). For potri and syevd with vectors
also jaxmg's memory analysis with ``A`` donated (``jax.jit(..., donate_argnums=0)``: the
result reuses ``A``'s buffer).

``--relayouts native jax`` compares jaxmg's two ways to the block-cyclic layout: in place by
the native leader (default) and JAX collectives.

Output: one JSON line per case on stdout (and in ``--json``), a markdown table at the end (and in
``--markdown``), and PNG plots with ``--plots DIR``.

Examples (CPU, 4 simulated devices; one device, both engines):
    python benchmarks/solvers.py --cpu-devices 4 --routines potrs --n 1024 2048 --tiles 128
    python benchmarks/solvers.py --cpu-devices 1 --routines potrs syevd --tiles 0 \
        --backends default mg
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

from _common import program_memory, progress, timed, timed_pair

ROUTINES = ("potrs", "potri", "syevd", "syevd_values", "lu_solve", "cho_solve")
BACKENDS = ("default", "mg")  # jaxmg's backend=None, and backend="mg"


# How A is sharded over the mesh axis "x": by columns (the original README's form) or by rows.
SHARDINGS = {"cols": (None, "x"), "rows": ("x", None)}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--routines", nargs="+", default=["potrs"], choices=ROUTINES)
    p.add_argument("--n", nargs="+", type=int, default=[1024, 2048])
    p.add_argument("--dtypes", nargs="+", default=["float64"])
    p.add_argument("--tiles", nargs="+", type=int, default=[128], help="T_A (0: None)")
    p.add_argument("--devices", nargs="+", type=int, default=None, help="device counts (all)")
    p.add_argument("--relayouts", nargs="+", default=["native"], choices=("native", "jax"))
    p.add_argument(
        "--shardings", nargs="+", default=["cols"], choices=tuple(SHARDINGS), help="A's sharding"
    )
    p.add_argument("--backends", nargs="+", default=["default"], choices=BACKENDS)
    p.add_argument("--nrhs", type=int, default=1)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--cpu-devices", type=int, default=4, help="simulated CPU devices (no GPU)")
    p.add_argument("--overhead-n", type=int, default=64, help="N for the fixed-cost probe (0: off)")
    p.add_argument("--json", type=pathlib.Path, help="write the JSON lines here")
    p.add_argument("--markdown", type=pathlib.Path, help="write the markdown table here")
    p.add_argument("--plots", type=pathlib.Path, help="write PNG plots into this folder")
    return p.parse_args(argv)


def flops(routine: str, n: int, nrhs: int, complex_: bool) -> float:
    count = {
        "potrs": n**3 / 3 + 2 * n**2 * nrhs,
        "potri": n**3 / 3 + 2 * n**3 / 3,
        "syevd": 4 * n**3,
        "syevd_values": 4 * n**3 / 3,
        "lu_solve": 2 * n**3 / 3 + 2 * n**2 * nrhs,
        "cho_solve": n**3 / 3 + 2 * n**2 * nrhs,
    }[routine]
    return count * (4 if complex_ else 1)


def make_matrix(n, dtype, routine, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    m = rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        m = m + 1j * rng.standard_normal((n, n))
    if routine.startswith("syevd"):
        return ((m + m.conj().T) / 2).astype(dtype)
    if routine == "lu_solve":  # general, eigenvalues away from 0
        return (m + 2 * np.sqrt(n) * np.eye(n)).astype(dtype)
    return (m @ m.conj().T / n + np.eye(n)).astype(dtype)


def programs(routine, tile, mesh, nrhs, relayout="native", backend="default"):
    """(jaxmg program, baseline program, residual(a, out), takes b, jaxmg with A donated).

    The donated program (potri, syevd with vectors: the results of A's shape) is only compiled,
    for its memory analysis: donating ``A`` lets the solver work in ``A``'s own buffer.
    """
    import jax
    import jax.numpy as jnp
    import jax.scipy.linalg as jsl
    import numpy as np

    import jaxmg

    def eps_n(a):
        return np.finfo(a.dtype).eps * a.shape[0]

    tile = tile or None
    kw = dict(relayout=relayout, backend=None if backend == "default" else backend)

    def check_solve(a, b, x):
        return np.linalg.norm(a @ x - b) / (np.linalg.norm(a, 1) * np.linalg.norm(x) * eps_n(a))

    cholesky = jax.jit(lambda a, b: jsl.cho_solve(jsl.cho_factor(a, lower=True), b))
    if routine == "potrs":
        mg = jax.jit(lambda a, b: jaxmg.potrs(a, b, tile, **kw))  # nothing to alias
        return mg, cholesky, check_solve, True, None
    if routine == "cho_solve":
        mg = jax.jit(lambda a, b: jaxmg.cho_solve(jaxmg.cho_factor(a, tile, **kw), b))
        return mg, cholesky, check_solve, True, None
    if routine == "lu_solve":
        mg = jax.jit(lambda a, b: jaxmg.lu_solve(a, b, tile, **kw))
        return mg, jax.jit(jnp.linalg.solve), check_solve, True, None
    if routine == "potri":

        def inv(a):
            return jaxmg.potri(a, tile, **kw)

        mg = jax.jit(inv)
        base = jax.jit(jnp.linalg.inv)

        def check(a, _, x):
            return np.linalg.norm(a @ x - np.eye(a.shape[0])) / (
                np.linalg.norm(a, 1) * np.linalg.norm(x, 1) * eps_n(a)
            )

        return mg, base, check, False, jax.jit(inv, donate_argnums=0)
    vectors = routine == "syevd"

    def eig(a):
        return jaxmg.syevd(a, tile, return_eigenvectors=vectors, **kw)

    mg = jax.jit(eig)
    base = jax.jit(jnp.linalg.eigh if vectors else jnp.linalg.eigvalsh)

    def check(a, _, out):
        w = np.asarray(out[0] if vectors else out)
        ref = np.linalg.eigvalsh(a)
        return np.max(np.abs(w - ref)) / (np.linalg.norm(a, 2) * eps_n(a))

    return mg, base, check, False, (jax.jit(eig, donate_argnums=0) if vectors else None)


def memory(fn, args, devices, prefix=""):
    """Bytes per device: the compiled memory analysis; on GPU also the peak in use so far."""
    out = {}
    if devices[0].platform == "gpu" and not prefix:
        stats = [d.memory_stats() or {} for d in devices]
        out["peak_bytes_per_device"] = max(s.get("peak_bytes_in_use", 0) for s in stats)
    parts = program_memory(fn.lower(*args).compile())
    parts.pop("peak_bytes", None)
    out.update({prefix + k: v for k, v in parts.items()})
    return out


def run_case(routine, n, dtype, tile, ndev, relayout, sharding, backend, args, all_devices):
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    devices = all_devices[:ndev]
    mesh = jax.make_mesh((ndev,), ("x",), devices=devices)
    a_host = make_matrix(n, dtype, routine)
    b_host = np.ones((n, args.nrhs), dtype)
    a = jax.device_put(a_host, NamedSharding(mesh, P(*SHARDINGS[sharding])))
    b = jax.device_put(b_host, NamedSharding(mesh, P()))
    a0 = jax.device_put(a_host, devices[0])
    b0 = jax.device_put(b_host, devices[0])
    mg, base, check, takes_b, donated = programs(routine, tile, mesh, args.nrhs, relayout, backend)
    mg_args, base_args = ((a, b), (a0, b0)) if takes_b else ((a,), (a0,))
    if devices[0].platform == "gpu":  # jaxmg's peak memory before the baseline's runs
        t_mg = timed(mg, mg_args, args.runs, args.warmup)
        mem_mg = memory(mg, mg_args, devices)
        t_base = timed(base, base_args, args.runs, args.warmup)
        ratios = [t_mg[0] / t_base[0]]
    else:
        t_mg, t_base, ratios = timed_pair(mg, mg_args, base, base_args, args.runs, args.warmup)
        mem_mg = memory(mg, mg_args, devices)
    mem_base = memory(base, base_args, devices[:1], prefix="baseline_")
    mem_donated = {} if donated is None else memory(donated, mg_args, devices, prefix="donated_")
    out = mg(*mg_args)
    out_host = jax.tree.map(np.asarray, out)
    residual = float(check(a_host, b_host, out_host))
    work = flops(routine, n, args.nrhs, np.dtype(dtype).kind == "c")
    return {
        "routine": routine,
        "n": n,
        "dtype": dtype,
        "T_A": tile,
        "relayout": relayout,
        "sharding": sharding,
        "backend": backend,
        "ndev": ndev,
        "platform": devices[0].platform,
        "device_kind": devices[0].device_kind,
        "jaxmg_s": t_mg[0],
        "jaxmg_min_s": t_mg[1],
        "jaxmg_max_s": t_mg[2],
        "baseline_s": t_base[0],
        "ratio_to_baseline": t_mg[0] / t_base[0],
        "pair_ratio_median": statistics.median(ratios),
        "pair_ratio_min": min(ratios),
        "pair_ratio_max": max(ratios),
        "jaxmg_tflops": work / t_mg[0] / 1e12,
        "baseline_tflops": work / t_base[0] / 1e12,
        "scaled_residual": residual,
        "check_passed": residual < 30,
        **mem_mg,
        **mem_base,
        **mem_donated,
    }


def overhead_us(n, all_devices, runs, backend="default"):
    """Median wall times (us) of one potrs call at tiny N, the per-call fixed cost, and of the
    baseline's (``cho_factor`` + ``cho_solve`` on one device), in the same run."""
    import jax
    import jax.scipy.linalg as jsl
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg

    mesh = jax.make_mesh((len(all_devices),), ("x",), devices=all_devices)
    n = max(n, len(all_devices)) // len(all_devices) * len(all_devices)
    a_host, b_host = make_matrix(n, "float32", "potrs"), np.ones((n, 1), np.float32)
    a = jax.device_put(a_host, NamedSharding(mesh, P(None, "x")))
    b = jax.device_put(b_host, NamedSharding(mesh, P()))
    engine = None if backend == "default" else backend
    fn = jax.jit(lambda a, b: jaxmg.potrs(a, b, n // len(all_devices), backend=engine))
    base = jax.jit(lambda a, b: jsl.cho_solve(jsl.cho_factor(a, lower=True), b))
    args0 = (jax.device_put(a_host, all_devices[0]), jax.device_put(b_host, all_devices[0]))
    mine, theirs, _ = timed_pair(fn, (a, b), base, args0, max(runs, 50), 5)
    return mine[0] * 1e6, theirs[0] * 1e6


def _mib(row, key):
    return f"{row[key] / 2**20:.1f}" if key in row else "-"


def _pairs(row):
    if "pair_ratio_median" not in row:
        return "-"
    return (
        f"{row['pair_ratio_median']:.2f} ({row['pair_ratio_min']:.2f}..{row['pair_ratio_max']:.2f})"
    )


def markdown(rows):
    head = (
        "| routine | N | dtype | T_A | relayout | A sharded by | devices | backend | "
        "jaxmg ms (min..max) | baseline ms | ratio | ratio per run (min..max) | TFLOP/s | "
        "residual | MiB/device | A donated | baseline MiB | GPU peak MiB |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        lines.append(
            f"| {r['routine']} | {r['n']} | {r['dtype']} | {r['T_A'] or 'auto'} | "
            f"{r['relayout']} | {r.get('sharding', 'cols')} | {r['ndev']} | "
            f"{r.get('backend', 'default')} | "
            f"{r['jaxmg_s'] * 1e3:.1f} ({r['jaxmg_min_s'] * 1e3:.1f}..{r['jaxmg_max_s'] * 1e3:.1f})"
            f" | {r['baseline_s'] * 1e3:.1f} | {r['ratio_to_baseline']:.2f} | "
            f"{_pairs(r)} | "
            f"{r['jaxmg_tflops']:.3f} | {r['scaled_residual']:.2g} | {_mib(r, 'program_bytes')} | "
            f"{_mib(r, 'donated_program_bytes')} | "
            f"{_mib(r, 'baseline_program_bytes')} | {_mib(r, 'peak_bytes_per_device')} |"
        )
    return head + "\n".join(lines) + "\n"


def _series(r):
    return (
        r["dtype"], r["T_A"], r["ndev"], r["relayout"], r.get("sharding", "cols"),
        r.get("backend", "default"),
    )  # fmt: skip


def plots(rows, folder):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots", file=sys.stderr)
        return
    folder.mkdir(parents=True, exist_ok=True)
    for routine in sorted({r["routine"] for r in rows}):
        mine = [r for r in rows if r["routine"] == routine]
        fig, (ax_t, ax_f) = plt.subplots(1, 2, figsize=(10, 4))
        for key in sorted({_series(r) for r in mine}):
            pts = sorted(
                ((r["n"], r) for r in mine if _series(r) == key),
                key=lambda p: p[0],
            )
            ns = [n for n, _ in pts]
            label = f"{key[0]} T_A={key[1]} ndev={key[2]} {key[3]} {key[4]} {key[5]}"
            ax_t.plot(ns, [r["jaxmg_s"] for _, r in pts], "o-", label=f"jaxmg {label}")
            ax_t.plot(ns, [r["baseline_s"] for _, r in pts], "x--", label=f"baseline {key[0]}")
            ax_f.plot(ns, [r["jaxmg_tflops"] for _, r in pts], "o-", label=label)
        ax_t.set(xlabel="N", ylabel="seconds", xscale="log", yscale="log", title=routine)
        ax_f.set(xlabel="N", ylabel="TFLOP/s", xscale="log", title=f"{routine} throughput")
        ax_t.legend(fontsize=7)
        ax_f.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(folder / f"{routine}_vs_n.png", dpi=120)
        plt.close(fig)
        tiles = sorted({r["T_A"] for r in mine})
        if len(tiles) > 1:
            fig, ax = plt.subplots(figsize=(5, 4))
            for n, relayout, sharding in sorted(
                {(r["n"], r["relayout"], r.get("sharding", "cols")) for r in mine}
            ):
                pts = sorted(
                    (r["T_A"], r["jaxmg_s"])
                    for r in mine
                    if (r["n"], r["relayout"], r.get("sharding", "cols")) == (n, relayout, sharding)
                )
                label = f"N={n} {relayout} {sharding}"
                ax.plot([t for t, _ in pts], [s for _, s in pts], "o-", label=label)
            ax.set(xlabel="T_A", ylabel="seconds", xscale="log", title=f"{routine}: tile sweep")
            ax.legend()
            fig.tight_layout()
            fig.savefig(folder / f"{routine}_tile_sweep.png", dpi=120)
            plt.close(fig)


def main(argv=None):
    args = parse(argv)
    import jax

    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    jax.config.update("jax_enable_x64", True)
    all_devices = jax.devices()
    counts = args.devices or [len(all_devices)]
    cases = [
        (routine, n, dtype, tile, ndev, relayout, sharding, backend)
        for routine in args.routines
        for n in args.n
        for dtype in args.dtypes
        for tile in args.tiles
        for ndev in counts
        for relayout in args.relayouts
        for sharding in args.shardings
        for backend in args.backends
        if n % ndev == 0 and ndev <= len(all_devices)
    ]
    rows = []
    sink = args.json.open("w") if args.json else None
    for i, case in enumerate(cases):
        progress(i, len(cases), "{} N={} {} T_A={} ndev={} {} {} {}".format(*case))
        row = run_case(*case, args, all_devices)
        rows.append(row)
        line = json.dumps(row)
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")
    progress(len(cases), len(cases), "done")
    for backend in args.backends if args.overhead_n else ():
        fixed, baseline = overhead_us(args.overhead_n, all_devices, args.runs, backend)
        line = json.dumps(
            {
                "overhead_potrs_us": fixed,
                "baseline_us": baseline,
                "backend": backend,
                "n": args.overhead_n,
                "ndev": len(all_devices),
                "platform": all_devices[0].platform,
            }
        )
        print(line)
        if sink:
            sink.write(line + "\n")
    if sink:
        sink.close()
    table = markdown(rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    if args.plots:
        plots(rows, args.plots)
    return 0 if all(r["check_passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
