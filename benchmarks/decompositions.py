"""svd, qr, polar and lstsq of a sharded matrix against JAX's own on one device (issue 28).

For each routine: jaxmg with ``A`` sharded by rows over every device, and JAX's function
(``jnp.linalg.svd(full_matrices=False)``, ``jnp.linalg.qr``, ``jax.scipy.linalg.polar``,
``jnp.linalg.lstsq``) on the same matrix whole on one device, timed alternately in the same
run (median seconds, and the median of the per-run ratios jaxmg / JAX), XLA's memory analysis
of each program per device (MiB, and in blocks of ``A``: ``N^2 x itemsize / ndev``; jaxmg's
also with ``A`` sharded by columns, compiled but not run), and the
accuracy of both on matrices of condition number 1, 1e4, 1e8 and 1e12 (singular values
spread geometrically): the backward error ``||A - factors||_F / ||A||_F`` and the loss of
orthonormality ``||Q^H Q - I||`` (max-norm), against numpy's singular values.

Example (4 simulated CPU devices):
    python benchmarks/decompositions.py --cpu-devices 4 --n 2048
On a GPU machine the devices are the GPUs (``--cpu-devices`` is ignored).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from functools import partial

from _common import program_memory, timed_pair

ROUTINES = ("svd", "qr", "polar", "lstsq")
CONDS = (1.0, 1e4, 1e8, 1e12)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--routines", nargs="+", default=list(ROUTINES), choices=ROUTINES)
    p.add_argument("--conds", nargs="+", type=float, default=list(CONDS))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--backend", default=None, help="jaxmg's backend (default: its choice)")
    p.add_argument("--cpu-devices", type=int, default=4, help="simulated CPU devices (no GPU)")
    p.add_argument("--json", type=pathlib.Path, help="append the JSON lines here")
    p.add_argument("--markdown", type=pathlib.Path, help="write the markdown table here")
    return p.parse_args(argv)


def functions(routine, b, backend):
    """``(jaxmg's, JAX's)``: each maps ``A`` to its factors (``lstsq``: to ``x``)."""
    import jax
    import jax.numpy as jnp

    import jaxmg

    if routine == "svd":
        return partial(jaxmg.svd, backend=backend), lambda a: jnp.linalg.svd(a, full_matrices=False)
    if routine == "qr":
        return partial(jaxmg.qr, backend=backend), jnp.linalg.qr
    if routine == "polar":
        return partial(jaxmg.polar, backend=backend), jax.scipy.linalg.polar
    return (lambda a: jaxmg.lstsq(a, b, backend=backend)[0]), (lambda a: jnp.linalg.lstsq(a, b)[0])


def accuracy(routine, a, out, b):
    """``(backward error, loss of orthonormality)`` of a result, in numpy float64."""
    import numpy as np

    a = np.asarray(a, np.float64)
    norm = np.linalg.norm(a)  # Frobenius norms throughout: no SVD of an N x N on the host
    if routine == "lstsq":  # the normal equations' residual, scaled as LAPACK's tests do
        x = np.asarray(out, np.float64)
        r = np.asarray(b, np.float64) - a @ x
        return float(np.linalg.norm(a.T @ r) / (norm**2 * np.linalg.norm(x))), 0.0
    out = [np.asarray(x, np.float64) for x in out]
    if not all(np.isfinite(x).all() for x in out):
        return float("nan"), float("nan")  # shown as nan in the table; the tests fail on it
    if routine == "svd":
        u, s, vh = out
        rebuilt, q = (u * s) @ vh, u
    else:
        q, other = out
        rebuilt = q @ other
    ortho = np.abs(q.T @ q - np.eye(q.shape[1])).max()
    return float(np.linalg.norm(a - rebuilt) / norm), float(ortho)


def conditioned(n, cond, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (u * np.logspace(0, -np.log10(cond), n)) @ v.T


def main(argv=None):
    args = parse(argv)
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_num_cpu_devices", args.cpu_devices)  # no effect where there are GPUs
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    ndev = jax.device_count()
    mesh = jax.make_mesh((ndev,), ("x",))
    n = args.n
    block = n * n * 8 / ndev
    rows = []
    for routine in args.routines:
        b = jnp.asarray(np.random.default_rng(1).standard_normal(n))
        ours, theirs = functions(routine, b, args.backend)
        ours_jit, theirs_jit = jax.jit(ours), jax.jit(theirs)
        platform = jax.devices()[0].platform
        row = dict(routine=routine, n=n, ndev=ndev, dtype="float64", platform=platform)
        row["backend"] = args.backend or "default"
        for k, cond in enumerate(args.conds):
            a = conditioned(n, cond, seed=k)
            A = jax.device_put(a, NamedSharding(mesh, P("x", None)))
            A1 = jax.device_put(a, jax.devices()[0])
            if k == 0:
                (t_ours, _, _), (t_theirs, _, _), ratios = timed_pair(
                    ours_jit, (A,), theirs_jit, (A1,), args.runs, args.warmup
                )
                mem_ours = program_memory(ours_jit.lower(A).compile())["program_bytes"]
                mem_theirs = program_memory(theirs_jit.lower(A1).compile())["program_bytes"]
                by_columns = jax.device_put(a, NamedSharding(mesh, P(None, "x")))
                mem_cols = program_memory(ours_jit.lower(by_columns).compile())["program_bytes"]
                del by_columns
                row.update(
                    jaxmg_s=t_ours,
                    jax_s=t_theirs,
                    ratio=float(np.median(ratios)),
                    jaxmg_blocks=mem_ours / block,
                    jaxmg_blocks_cols=mem_cols / block,
                    jax_blocks=mem_theirs / block,
                    jaxmg_mib=mem_ours / 2**20,
                    jax_mib=mem_theirs / 2**20,
                )
            bw, orth = accuracy(routine, a, ours_jit(A), b)
            bw_ref, orth_ref = accuracy(routine, a, theirs_jit(A1), b)
            row[f"cond_{cond:g}"] = dict(jaxmg=(bw, orth), jax=(bw_ref, orth_ref))
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps(row) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(rows, args.conds))
    return 0


def markdown(rows, conds):
    head = rows[0]
    lines = [
        f"# svd, qr, polar, lstsq: jaxmg on {head['ndev']} {head['platform']} devices (rows, "
        f"backend {head['backend']}) against JAX on one, N = {head['n']}, float64",
        "",
        "| routine | jaxmg s | JAX s | ratio | memory per device, blocks of A: jaxmg / JAX "
        "| jaxmg, A by columns |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['routine']} | {r['jaxmg_s']:.3g} | {r['jax_s']:.3g} | {r['ratio']:.2f} | "
            f"{r['jaxmg_blocks']:.2f} / {r['jax_blocks']:.2f} | {r['jaxmg_blocks_cols']:.2f} |"
        )
    lines += [
        "",
        "Accuracy (backward error / loss of orthonormality; lstsq: the normal equations' "
        "scaled residual), jaxmg vs JAX:",
        "",
        "| routine | " + " | ".join(f"cond {c:g}" for c in conds) + " |",
        "|---|" + "---|" * len(conds),
    ]
    for r in rows:
        cells = []
        for c in conds:
            ours, theirs = r[f"cond_{c:g}"]["jaxmg"], r[f"cond_{c:g}"]["jax"]
            if r["routine"] == "lstsq":
                cells.append(f"{ours[0]:.1e} vs {theirs[0]:.1e}")
            else:
                cells.append(f"{ours[0]:.1e}/{ours[1]:.1e} vs {theirs[0]:.1e}/{theirs[1]:.1e}")
        lines.append(f"| {r['routine']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
