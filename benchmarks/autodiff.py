"""Benchmark jaxmg's derivatives: a Gaussian-process likelihood and an LU solve.

Gaussian process (``gp_nll``): the negative log marginal likelihood

    L(theta) = 0.5 y^T K^-1 y + 0.5 log det K,
    K_ij = s^2 exp(-|x_i - x_j|^2 / (2 l^2)) + noise delta_ij,  theta = (log l, log s, log noise),

with ``K`` built on the mesh, sharded by columns ``P(None, 'x')`` (each device builds its own
columns), for random points ``x`` in ``--dim`` dimensions and a random ``y``. Timed, all
jitted, in the same run: jaxmg's value (``jaxmg.potrs(K, y, return_logdet=True)``: one native
call, factor and solve) and ``jax.value_and_grad`` with respect to ``theta``; JAX on one device
(``jax.scipy.linalg.cho_factor``/``cho_solve`` and ``2 sum log diag``, ``K`` unsharded) the
same two. ``gp_datafit`` is the data-fit term ``0.5 y^T K^-1 y`` alone, the same four timings.
``k_nll`` and ``k_datafit``: the same losses of the matrix ``K`` at ``theta``, differentiated
with respect to ``K`` itself: the solver's share, without building ``K`` and the kernel's
derivative (``O(N^2)`` elementwise work per parameter that XLA:CPU takes its time over).

What to expect of ``value_and_grad / value``. The data fit's backward pass is one more solve
with the forward factor (``O(N^2)`` flops): the compiled gradient runs the fused ``potrs`` of
the value (which also returns its factor) and one factored solve. On the CPU twin that solve
gathers the whole factor into one LAPACK matrix (N = 2048: about 16 ms), so ``k_datafit``'s
ratio is about 1.3 there (on a GPU the solve is small next to the factorisation). The
log-determinant's gradient ``tr(K^-1 dK)`` needs ``K^-1`` itself, from the same factor
(potri: about 2 N^3 / 3 more flops than the N^3 / 3 of the factorisation), so the likelihood's
ratio is about 3-4; JAX's own ratio is printed beside it (its backward pass goes through the
Cholesky factorisation's derivative).

LU (``lu_solve``): ``jaxmg.lu_solve(A, b)`` against ``jnp.linalg.solve(A, b)`` on one device,
``A`` random and well conditioned (``G / sqrt(N) + 3 I``: singular values in [1, 5]), one
right-hand side.

Checks: jaxmg's values and gradients against the single-device ones, relative error below
``1e-6`` in float64 (``2e-3`` in float32); the LU solution likewise. A failed check makes the
exit status 1.

Timing: ``--warmup`` untimed runs then ``--runs`` timed runs ending in ``block_until_ready``;
the median and the spread (min..max). Output: one JSON line per case on stdout (and in
``--json``), markdown tables at the end (and in ``--markdown``).

Example (CPU, 4 simulated devices):
    python benchmarks/autodiff.py --cpu-devices 4 --n 1024 2048 --runs 3 --warmup 1
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from _common import progress, timed

TARGET_RATIO = 1.3  # the target for jaxmg's value_and_grad / value
CASES = ("gp_nll", "gp_datafit", "k_nll", "k_datafit", "lu_solve")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", nargs="+", type=int, default=[2048])
    p.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    p.add_argument("--dim", type=int, default=2, choices=(1, 2), help="dimension of the points")
    p.add_argument("--tile", type=int, default=None, help="jaxmg's T_A (default: its choice)")
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--cpu-devices", type=int, default=4, help="simulated CPU devices (no GPU)")
    p.add_argument("--json", type=pathlib.Path, help="write the JSON lines here")
    p.add_argument("--markdown", type=pathlib.Path, help="write the markdown tables here")
    return p.parse_args(argv)


def tolerance(dtype) -> float:
    return 1e-6 if dtype == "float64" else 2e-3


def _rel(a, b) -> float:
    import numpy as np

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), np.finfo(np.float64).tiny))


# --- the Gaussian process ----------------------------------------------------------------------

# (l, s, noise): theta = their logs, where the likelihood and its gradient are evaluated.
THETA = (0.2, 1.0, 0.1)


def gp_data(n, dim, dtype, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 1.0, (n, dim)).astype(dtype)
    y = rng.standard_normal((n, 1)).astype(dtype)
    theta = np.log(np.asarray(THETA)).astype(dtype)
    return theta, x, y


def kernel_block(theta, x_rows, x_cols, col0):
    """``K[:, col0:col0 + len(x_cols)]``: squared exponential plus the noise on the diagonal."""
    import jax.numpy as jnp

    length, scale, noise = jnp.exp(theta[0]), jnp.exp(theta[1]), jnp.exp(theta[2])
    diff = x_rows[:, None, :] - x_cols[None, :, :]
    sq = jnp.sum(diff * diff, axis=-1)
    k = scale**2 * jnp.exp(-sq / (2 * length**2))
    rows = jnp.arange(x_rows.shape[0])[:, None]
    cols = col0 + jnp.arange(x_cols.shape[0])[None, :]
    return k + jnp.where(rows == cols, noise, jnp.zeros((), k.dtype))


def sharded_kernel(mesh, theta, x):
    """``K`` sharded by columns over ``mesh``'s axis ``'x'``: every device builds its columns."""
    import jax
    from jax.sharding import PartitionSpec as P

    ndev = mesh.shape["x"]

    def body(theta, x):
        width = x.shape[0] // ndev
        col0 = jax.lax.axis_index("x") * width
        x_cols = jax.lax.dynamic_slice_in_dim(x, col0, width)
        return kernel_block(theta, x, x_cols, col0)

    return jax.shard_map(body, mesh=mesh, in_specs=(P(), P()), out_specs=P(None, "x"))(theta, x)


def gp_programs(mesh, tile, datafit_only, wrt_matrix=False):
    """``{(impl, kind): jit(fn)(theta, x, y)}``; impl: jaxmg or jax; kind: value, value_and_grad.

    ``wrt_matrix``: the same losses of a given ``K`` (``fn(K, y)``), differentiated with respect
    to ``K`` itself: the solver's share without the kernel's."""
    import jax
    import jax.numpy as jnp
    import jax.scipy.linalg as jsl
    from jax.sharding import PartitionSpec as P

    import jaxmg

    specs = (P(None, "x"), P())

    def mg_loss(theta, x, y):
        k = sharded_kernel(mesh, theta, x)
        return mg_of_k(k, y)

    def mg_of_k(k, y):
        if datafit_only:
            alpha = jaxmg.potrs(k, y, tile, mesh=mesh, in_specs=specs)
            return 0.5 * jnp.sum(y * alpha)
        alpha, logdet = jaxmg.potrs(k, y, tile, mesh=mesh, in_specs=specs, return_logdet=True)
        return 0.5 * jnp.sum(y * alpha) + 0.5 * logdet

    def jax_loss(theta, x, y):
        return jax_of_k(kernel_block(theta, x, x, 0), y)

    def jax_of_k(k, y):
        c, lower = jsl.cho_factor(k, lower=True)
        fit = 0.5 * jnp.sum(y * jsl.cho_solve((c, lower), y))
        if datafit_only:
            return fit
        return fit + jnp.sum(jnp.log(jnp.diagonal(c)))  # 0.5 * logdet K

    if wrt_matrix:
        mg_loss, jax_loss = mg_of_k, jax_of_k
    out = {}
    for impl, loss in (("jaxmg", mg_loss), ("jax", jax_loss)):
        out[impl, "value"] = jax.jit(loss)
        out[impl, "value_and_grad"] = jax.jit(jax.value_and_grad(loss))
    return out


def run_gp(case, n, args, devices):
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)
    theta, x, y = gp_data(n, args.dim, args.dtype)
    on_mesh = tuple(jax.device_put(v, NamedSharding(mesh, P())) for v in (theta, x, y))
    on_one = tuple(jax.device_put(v, devices[0]) for v in (theta, x, y))
    wrt_matrix = case.startswith("k_")
    if wrt_matrix:  # K at theta, given: sharded by columns for jaxmg, whole on one device
        k = np.asarray(kernel_block(*on_one[:2], on_one[1], 0))
        on_mesh = (jax.device_put(k, NamedSharding(mesh, P(None, "x"))), on_mesh[2])
        on_one = (jax.device_put(k, devices[0]), on_one[2])
    fns = gp_programs(mesh, args.tile, case.endswith("datafit"), wrt_matrix)
    times, results = {}, {}
    for impl, inputs in (("jaxmg", on_mesh), ("jax", on_one)):
        for kind in ("value", "value_and_grad"):
            fn = fns[impl, kind]
            times[impl, kind] = timed(fn, inputs, args.runs, args.warmup)
            results[impl, kind] = jax.tree.map(np.asarray, fn(*inputs))
    value_err = _rel(results["jaxmg", "value"], results["jax", "value"])
    vg_value_err = _rel(results["jaxmg", "value_and_grad"][0], results["jax", "value_and_grad"][0])
    grads = [results[impl, "value_and_grad"][1] for impl in ("jaxmg", "jax")]
    if wrt_matrix:  # jax.scipy's cho_factor reads one triangle; compare Hermitian parts
        grads = [(g + g.conj().T) / 2 for g in grads]
    grad_err = _rel(*grads)
    tol = tolerance(args.dtype)
    ratio = times["jaxmg", "value_and_grad"][0] / times["jaxmg", "value"][0]
    row = {
        "case": case,
        "n": n,
        "dtype": args.dtype,
        "dim": args.dim,
        "T_A": args.tile,
        "ndev": len(devices),
        "platform": devices[0].platform,
        "theta": [float(t) for t in theta],
        "value": float(results["jax", "value"]),
    }
    for (impl, kind), (median, low, high) in times.items():
        row[f"{impl}_{kind}_s"] = median
        row[f"{impl}_{kind}_min_s"] = low
        row[f"{impl}_{kind}_max_s"] = high
    row.update(
        {
            "jaxmg_grad_ratio": ratio,
            "jax_grad_ratio": times["jax", "value_and_grad"][0] / times["jax", "value"][0],
            "target_grad_ratio": TARGET_RATIO,
            "meets_target": ratio <= TARGET_RATIO,
            "ratio_to_jax_value": times["jaxmg", "value"][0] / times["jax", "value"][0],
            "ratio_to_jax_value_and_grad": (
                times["jaxmg", "value_and_grad"][0] / times["jax", "value_and_grad"][0]
            ),
            "value_rel_err": value_err,
            "value_and_grad_value_rel_err": vg_value_err,
            "grad_rel_err": grad_err,
            "tolerance": tol,
            "check_passed": all(e <= tol for e in (value_err, vg_value_err, grad_err)),
        }
    )
    return row


# --- LU -----------------------------------------------------------------------------------------


def lu_data(n, dtype, seed=1):
    import numpy as np

    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n)) / np.sqrt(n) + 3 * np.eye(n)
    b = rng.standard_normal((n, 1))
    return a.astype(dtype), b.astype(dtype)


def run_lu(n, args, devices):
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg

    mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)
    a_host, b_host = lu_data(n, args.dtype)
    a = jax.device_put(a_host, NamedSharding(mesh, P(None, "x")))
    b = jax.device_put(b_host, NamedSharding(mesh, P()))
    a0, b0 = jax.device_put(a_host, devices[0]), jax.device_put(b_host, devices[0])
    spec = (P(None, "x"), P())
    mg = jax.jit(lambda a, b: jaxmg.lu_solve(a, b, args.tile, mesh=mesh, in_specs=spec))
    base = jax.jit(jnp.linalg.solve)
    t_mg = timed(mg, (a, b), args.runs, args.warmup)
    t_base = timed(base, (a0, b0), args.runs, args.warmup)
    x_mg, x_base = np.asarray(mg(a, b)), np.asarray(base(a0, b0))
    err = _rel(x_mg, x_base)
    eps = np.finfo(a_host.dtype).eps
    residual = float(
        np.linalg.norm(a_host @ x_mg - b_host)
        / (np.linalg.norm(a_host, 1) * np.linalg.norm(x_mg) * eps * n)
    )
    tol = tolerance(args.dtype)
    return {
        "case": "lu_solve",
        "n": n,
        "dtype": args.dtype,
        "T_A": args.tile,
        "ndev": len(devices),
        "platform": devices[0].platform,
        "jaxmg_s": t_mg[0],
        "jaxmg_min_s": t_mg[1],
        "jaxmg_max_s": t_mg[2],
        "jax_s": t_base[0],
        "jax_min_s": t_base[1],
        "jax_max_s": t_base[2],
        "ratio_to_jax": t_mg[0] / t_base[0],
        "rel_err": err,
        "scaled_residual": residual,
        "tolerance": tol,
        "check_passed": bool(err <= tol and residual < 30),
    }


# --- report -------------------------------------------------------------------------------------


def _ms(row, key):
    """``median (min..max)`` in ms of ``key`` (``..._s``)."""
    low, high = row[key[:-2] + "_min_s"], row[key[:-2] + "_max_s"]
    return f"{row[key] * 1e3:.1f} ({low * 1e3:.1f}..{high * 1e3:.1f})"


def markdown(rows):
    gp = [r for r in rows if r["case"] != "lu_solve"]
    lu = [r for r in rows if r["case"] == "lu_solve"]
    out = []
    if gp:
        out.append(
            "| case | N | dtype | devices | jaxmg value ms (min..max) | jaxmg value+grad ms | "
            "jaxmg v+g / v | JAX value ms | JAX value+grad ms | JAX v+g / v | jaxmg / JAX value "
            "| jaxmg / JAX v+g | value rel err | grad rel err | ok |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        )
        for r in gp:
            out.append(
                f"| {r['case']} | {r['n']} | {r['dtype']} | {r['ndev']} | "
                f"{_ms(r, 'jaxmg_value_s')} | {_ms(r, 'jaxmg_value_and_grad_s')} | "
                f"{r['jaxmg_grad_ratio']:.2f} | {_ms(r, 'jax_value_s')} | "
                f"{_ms(r, 'jax_value_and_grad_s')} | {r['jax_grad_ratio']:.2f} | "
                f"{r['ratio_to_jax_value']:.2f} | {r['ratio_to_jax_value_and_grad']:.2f} | "
                f"{max(r['value_rel_err'], r['value_and_grad_value_rel_err']):.1e} | "
                f"{r['grad_rel_err']:.1e} | {'yes' if r['check_passed'] else 'NO'} |"
            )
        out.append("")
    if lu:
        out.append(
            "| case | N | dtype | devices | jaxmg.lu_solve ms (min..max) | jnp.linalg.solve ms "
            "(min..max) | jaxmg / JAX | rel err | residual | ok |\n"
            "|---|---|---|---|---|---|---|---|---|---|"
        )
        for r in lu:
            out.append(
                f"| {r['case']} | {r['n']} | {r['dtype']} | {r['ndev']} | {_ms(r, 'jaxmg_s')} | "
                f"{_ms(r, 'jax_s')} | {r['ratio_to_jax']:.2f} | {r['rel_err']:.1e} | "
                f"{r['scaled_residual']:.2g} | {'yes' if r['check_passed'] else 'NO'} |"
            )
        out.append("")
    return "\n".join(out)


def main(argv=None):
    args = parse(argv)
    import jax

    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    jax.config.update("jax_enable_x64", True)
    devices = jax.devices()
    cases = [(case, n) for n in args.n for case in args.cases if n % len(devices) == 0]
    skipped = [n for n in args.n if n % len(devices)]
    if skipped:
        print(f"skipped N={skipped}: not divisible by {len(devices)} devices", file=sys.stderr)
    rows = []
    sink = args.json.open("w") if args.json else None
    for i, (case, n) in enumerate(cases):
        progress(i, len(cases), f"{case} N={n} {args.dtype} ndev={len(devices)}")
        row = run_lu(n, args, devices) if case == "lu_solve" else run_gp(case, n, args, devices)
        rows.append(row)
        line = json.dumps(row)
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")
            sink.flush()
    progress(len(cases), len(cases), "done")
    if sink:
        sink.close()
    table = markdown(rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    failed = [f"{r['case']} N={r['n']}" for r in rows if not r["check_passed"]]
    if failed:
        print(f"FAILED checks (tolerance {tolerance(args.dtype):g}): {failed}", file=sys.stderr)
    return 1 if failed or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
