"""Layout round trip (block -> block-cyclic -> block) against a plain copy of the same array.

For each N x ndev x T_A: ``undo_cyclic_1d_layout(cyclic_1d_layout(a))`` jitted (and for each
N x grid x T_A of ``--grids``, the 2D ``undo_cyclic_2d_layout(cyclic_2d_layout(a))`` on
``P(r, c)``), timed against
a jitted copy (``a + 0``, a full read and write of every shard) in the same run, and the
compiled round trip's temporary memory per device (XLA memory analysis) over the shard bytes.
Targets: round trip <= 3x the copy; temporaries <= 2x the shard.

    python benchmarks/layout_roundtrip.py                 # 4 simulated CPU devices
    python benchmarks/layout_roundtrip.py --n 1024 --devices 2 --tiles 64 --json out.jsonl
    python benchmarks/layout_roundtrip.py --devices --grids 2x2 1x4   # 2D only
"""

from __future__ import annotations

import argparse
import json
import pathlib

from _common import progress, timed


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", nargs="+", type=int, default=[1024, 4096])
    p.add_argument("--devices", nargs="*", type=int, default=[2, 4])
    p.add_argument("--grids", nargs="*", default=[], help="2D process grids, e.g. 2x2 1x4")
    p.add_argument("--tiles", nargs="+", type=int, default=[64, 256])
    p.add_argument("--dtype", default="float32")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--cpu-devices", type=int, default=4, help="simulated CPU devices (no GPU)")
    p.add_argument("--json", type=pathlib.Path, help="write the JSON lines here")
    return p.parse_args(argv)


def main(argv=None):
    args = parse(argv)
    import jax

    grids = [tuple(int(v) for v in g.split("x")) for g in args.grids]
    most = max([*args.devices, *(r * c for r, c in grids)], default=1)
    jax.config.update("jax_num_cpu_devices", max(args.cpu_devices, most))
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg_layout as jl

    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        devices = jax.devices("cpu")
    layouts = [(d,) for d in args.devices] + grids
    cases = [
        (n, shape, t)
        for n in args.n
        for shape in layouts
        for t in args.tiles
        if int(np.prod(shape)) <= len(devices)
    ]
    rows = []
    for i, (n, shape, tile) in enumerate(cases):
        ndev = int(np.prod(shape))
        label = "x".join(map(str, shape))
        progress(i, len(cases), f"N={n} devices={label} T_A={tile}")
        names, spec = (("x",), P(None, "x")) if len(shape) == 1 else (("r", "c"), P("r", "c"))
        mesh = jax.make_mesh(shape, names, devices=devices[:ndev])
        a = jax.device_put(
            jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), args.dtype),
            NamedSharding(mesh, spec),
        )
        kind = devices[0].device_kind
        row = {"N": n, "ndev": label, "T_A": tile, "dtype": args.dtype, "device": kind}
        try:
            if len(shape) == 2:
                plan = jl.BlockCyclic2D.for_blocks(n, shape, tile)
            else:
                plan = jl.CyclicPlan.make(n, ndev, tile)
        except ValueError as err:
            row["skipped"] = str(err).split(":")[0]
            rows.append(row)
            continue

        grid = len(shape) == 2

        def trip(x, t=tile, n=n, grid=grid):
            if grid:
                return jl.undo_cyclic_2d_layout(jl.cyclic_2d_layout(x, t), t, n)
            return jl.undo_cyclic_1d_layout(jl.cyclic_1d_layout(x, t), t, n)

        roundtrip = jax.jit(trip)
        copy = jax.jit(lambda x: x + 0)
        assert np.array_equal(np.asarray(roundtrip(a)), np.asarray(a)), "round trip is wrong"
        t_rt = timed(roundtrip, (a,), args.runs, args.warmup)
        t_copy = timed(copy, (a,), args.runs, args.warmup)
        shard_bytes = a.addressable_shards[0].data.nbytes
        analysis = roundtrip.lower(a).compile().memory_analysis()
        temp = analysis.temp_size_in_bytes if analysis is not None else float("nan")
        if len(shape) == 2:
            moves = any(
                p > 1 and plan.tile < s for p, s in zip(shape, plan.shard_shape, strict=True)
            )
            moved = "2d" if moves else "none"
            padding = [
                p - s for p, s in zip(plan.padded_local_shape, plan.shard_shape, strict=True)
            ]
            row.update(relayout=moved, padding=padding)
        else:
            relayout = "shift" if plan.shift_relayout else "gather"
            row.update(relayout=relayout if plan.needs_relayout else "none", padding=plan.padding)
        row.update(
            roundtrip_ms=1e3 * t_rt[0],
            roundtrip_spread_ms=[1e3 * t_rt[1], 1e3 * t_rt[2]],
            copy_ms=1e3 * t_copy[0],
            ratio_to_copy=t_rt[0] / t_copy[0],
            temp_bytes_per_device=temp,
            temp_over_shard=temp / shard_bytes,
        )
        rows.append(row)
    progress(len(cases), len(cases), "done")

    print("| N | devices | T_A | relayout | round trip ms | copy ms | ratio | temp/shard |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "skipped" in r:
            print(f"| {r['N']} | {r['ndev']} | {r['T_A']} | invalid T_A | | | | |")
            continue
        print(
            f"| {r['N']} | {r['ndev']} | {r['T_A']} | {r['relayout']} | {r['roundtrip_ms']:.2f} | "
            f"{r['copy_ms']:.2f} | {r['ratio_to_copy']:.2f} | {r['temp_over_shard']:.2f} |"
        )
    lines = "\n".join(json.dumps(r) for r in rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(lines + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
