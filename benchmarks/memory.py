"""Memory per device of each routine, with ``A`` kept and with ``A`` donated (issue 26).

For every routine, the compiled programs that an eager call runs, with ``donate=False`` and
with ``donate=True`` (the latter are also what ``jax.jit(..., donate_argnums=0)`` compiles
around a call whose result has ``A``'s shape), and XLA's memory analysis of each: per device,
arguments + outputs - aliased + temporaries (``_common.program_memory``), in MiB and in blocks
of ``A`` (``N^2 x itemsize / ndev``). ``lu_solve`` (from the matrix) runs two programs, the
factorisation and the solve: its row is the larger of the two. Memory a native call takes from
XLA's scratch allocator while it runs (the library's workspace) is in none of these. Nothing is
run: programs are only compiled.

Baseline, on one device of the same process: JAX's own ``cho_factor`` + ``cho_solve``,
``lu_factor`` + ``lu_solve``, ``jnp.linalg.inv`` and ``jnp.linalg.eigh`` (``jax.scipy``), the
same matrix whole, with the same donation.

Example (4 simulated CPU devices):
    python benchmarks/memory.py --cpu-devices 4 --n 2048 4096 --tiles 0 128
(tile 0: ``N / ndev``, one tile per device, no relayout; -1: the engine's own choice.)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from _common import program_memory

ROUTINES = ("potrs", "potrs_logdet", "cho_factor", "lu_factor", "lu_solve", "potri", "syevd")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", nargs="+", type=int, default=[2048, 4096])
    p.add_argument(
        "--tiles", nargs="+", type=int, default=[0, 128], help="0: N / ndev; -1: the engine's own"
    )
    p.add_argument("--routines", nargs="+", default=list(ROUTINES), choices=ROUTINES)
    p.add_argument("--shardings", nargs="+", default=["cols", "rows"], choices=["cols", "rows"])
    p.add_argument("--backend", default=None, help="jaxmg's backend (default: its choice)")
    p.add_argument("--cpu-devices", type=int, default=4, help="simulated CPU devices (no GPU)")
    p.add_argument("--json", type=pathlib.Path, help="append the JSON lines here")
    p.add_argument("--markdown", type=pathlib.Path, help="write the markdown table here")
    return p.parse_args(argv)


def _bytes(fn, *args):
    return program_memory(fn.lower(*args).compile())["program_bytes"]


def jaxmg_programs(routine, a, b, T_A, backend):
    """``(kept, donated)``: lists of ``(jitted program, args)`` an eager call runs."""
    from jaxmg.programs import derivatives as _derivatives, routines as _programs
    from jaxmg.solvers import hermitian as _api

    spec = a.sharding.spec
    task = {"potrs_logdet": "potrs", "cho_factor": "potrs", "lu_factor": "getrf"}
    task = task.get(routine, "getrf" if routine == "lu_solve" else routine)
    call, _ = _api._prepare(
        a, T_A, a.sharding.mesh, spec, False, "native", True, "bench", task, backend
    )
    if routine in ("potrs", "potrs_logdet"):
        flags = (call, routine == "potrs_logdet", True, b.shape)
        donated = _api._potrs_donated if _api._factor_in_a(call) else _derivatives._potrs_call
        return [(_derivatives._potrs_call, (*flags, a, b))], [(donated, (*flags, a, b))]
    if routine == "cho_factor":
        return [(_programs._potrf_program, (call, a))], [(_api._potrf_donated, (call, a))]
    if routine in ("lu_factor", "lu_solve"):
        kept = [(_programs._getrf_program, (call, a))]
        donated = [(_api._getrf_donated, (call, a))]
        if routine == "lu_solve":
            import jax

            lu, pivots, _ = jax.eval_shape(_programs._getrf_program, call, a)
            lu = jax.ShapeDtypeStruct(lu.shape, lu.dtype, sharding=lu.sharding)
            pivots = jax.ShapeDtypeStruct(pivots.shape, pivots.dtype, sharding=pivots.sharding)
            solve = (_programs._lu_solve_program, (call, "N", lu, pivots, b))
            kept.append(solve)
            donated.append(solve)
        return kept, donated
    if routine == "potri":
        kept = [(_derivatives._potri_call, (call, True, a))]
        return kept, [(_api._potri_donated, (call, True, a))]
    return [(_derivatives._syevd_call, (call, True, True, a))], [
        (_api._syevd_donated, (call, True, True, a))
    ]


def jax_baseline(routine, a, b):
    """``(kept, donated)`` programs of JAX's own solver on one device."""
    import jax
    import jax.numpy as jnp
    import jax.scipy.linalg as jsl

    def potrs(a, b):
        return jsl.cho_solve(jsl.cho_factor(a, lower=True), b)

    def potrs_logdet(a, b):
        c = jsl.cho_factor(a, lower=True)
        return jsl.cho_solve(c, b), 2 * jnp.sum(jnp.log(jnp.diagonal(c[0])))

    def lu_solve(a, b):
        return jsl.lu_solve(jsl.lu_factor(a), b)

    fns = {
        "potrs": (potrs, (a, b)),
        "potrs_logdet": (potrs_logdet, (a, b)),
        "cho_factor": (lambda a: jsl.cho_factor(a, lower=True)[0], (a,)),
        "lu_factor": (lambda a: jsl.lu_factor(a), (a,)),
        "lu_solve": (lu_solve, (a, b)),
        "potri": (jnp.linalg.inv, (a,)),
        "syevd": (jnp.linalg.eigh, (a,)),
    }
    fn, args = fns[routine]
    return jax.jit(fn), jax.jit(fn, donate_argnums=0), args


def main(argv=None):
    args = parse(argv)
    import warnings

    import jax

    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
    ndev = jax.device_count()
    mesh = jax.make_mesh((ndev,), ("x",))
    one = jax.devices()[0]
    rows = []
    for n in args.n:
        block = n * n * 8 / ndev
        host = np.eye(n)  # compiled only: the values do not matter
        b_one = jax.device_put(jnp.ones((n, 1)), one)
        a_one = jax.device_put(jnp.asarray(host), one)
        for routine in args.routines:
            base_kept, base_donated, base_args = jax_baseline(routine, a_one, b_one)
            base = (
                _bytes(base_kept, *base_args) / 2**20,
                _bytes(base_donated, *base_args) / 2**20,
            )
            for form in args.shardings:
                spec = P(None, "x") if form == "cols" else P("x", None)
                a = jax.device_put(jnp.asarray(host), NamedSharding(mesh, spec))
                b = jax.device_put(jnp.ones((n, 1)), NamedSharding(mesh, P()))
                for tile in args.tiles:
                    T_A = n // ndev if tile == 0 else None if tile < 0 else tile
                    if ndev == 1 and tile != args.tiles[0] and args.backend in (None, "jax"):
                        continue  # JAX's dense solvers take A whole: the tile changes nothing
                    kept, donated = jaxmg_programs(routine, a, b, T_A, args.backend)
                    kept_b = max(_bytes(f, *xs) for f, xs in kept)
                    donated_b = max(_bytes(f, *xs) for f, xs in donated)
                    row = dict(
                        routine=routine,
                        n=n,
                        ndev=ndev,
                        sharding=form,
                        T_A=T_A,
                        backend=args.backend or "default",
                        block_mib=block / 2**20,
                        kept_mib=kept_b / 2**20,
                        donated_mib=donated_b / 2**20,
                        kept_blocks=kept_b / block,
                        donated_blocks=donated_b / block,
                        jax_one_device_mib=base[0],
                        jax_one_device_donated_mib=base[1],
                    )
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if args.json:
                        with open(args.json, "a") as f:
                            f.write(json.dumps(row) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(rows))
    else:
        sys.stdout.write(markdown(rows))


def markdown(rows):
    lines = [
        "| routine | N | ndev | A sharded by | T_A | block MiB | kept MiB (blocks) | donated MiB "
        "(blocks) | JAX one device MiB (donated) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['routine']} | {r['n']} | {r['ndev']} | {r['sharding']} | {r['T_A']} | "
            f"{r['block_mib']:.0f} | {r['kept_mib']:.0f} ({r['kept_blocks']:.2f}) | "
            f"{r['donated_mib']:.0f} ({r['donated_blocks']:.2f}) | "
            f"{r['jax_one_device_mib']:.0f} ({r['jax_one_device_donated_mib']:.0f}) |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
