"""Layout round trip (block -> block-cyclic -> block) against a plain copy of the same array.

For each N x ndev x T_A: ``undo_cyclic_1d_layout(cyclic_1d_layout(a))`` jitted, timed against
a jitted copy (``a + 0``, a full read and write of every shard) in the same run, and the
compiled round trip's temporary memory per device (XLA memory analysis) over the shard bytes.
Targets: round trip <= 3x the copy; temporaries <= 2x the shard.

    python benchmarks/layout_roundtrip.py                 # 4 simulated CPU devices
    python benchmarks/layout_roundtrip.py --n 1024 --devices 2 --tiles 64 --json out.jsonl
"""

from __future__ import annotations

import argparse
import json
import pathlib

from _common import progress, timed


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", nargs="+", type=int, default=[1024, 4096])
    p.add_argument("--devices", nargs="+", type=int, default=[2, 4])
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

    jax.config.update("jax_num_cpu_devices", max(args.cpu_devices, max(args.devices)))
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jaxmg_layout as jl

    try:
        devices = jax.devices("gpu")
    except RuntimeError:
        devices = jax.devices("cpu")
    cases = [
        (n, d, t) for n in args.n for d in args.devices for t in args.tiles if d <= len(devices)
    ]
    rows = []
    for i, (n, ndev, tile) in enumerate(cases):
        progress(i, len(cases), f"N={n} ndev={ndev} T_A={tile}")
        mesh = jax.make_mesh((ndev,), ("x",), devices=devices[:ndev])
        a = jax.device_put(
            jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), args.dtype),
            NamedSharding(mesh, P(None, "x")),
        )
        kind = devices[0].device_kind
        row = {"N": n, "ndev": ndev, "T_A": tile, "dtype": args.dtype, "device": kind}
        try:
            plan = jl.CyclicPlan.make(n, ndev, tile)
        except ValueError as err:
            row["skipped"] = str(err).split(":")[0]
            rows.append(row)
            continue

        def trip(x, t=tile, n=n):
            return jl.undo_cyclic_1d_layout(jl.cyclic_1d_layout(x, t), t, n)

        roundtrip = jax.jit(trip)
        copy = jax.jit(lambda x: x + 0)
        assert np.array_equal(np.asarray(roundtrip(a)), np.asarray(a)), "round trip is wrong"
        t_rt = timed(roundtrip, (a,), args.runs, args.warmup)
        t_copy = timed(copy, (a,), args.runs, args.warmup)
        shard_bytes = a.addressable_shards[0].data.nbytes
        analysis = roundtrip.lower(a).compile().memory_analysis()
        temp = analysis.temp_size_in_bytes if analysis is not None else float("nan")
        row.update(
            relayout="shift"
            if plan.shift_relayout
            else "gather"
            if plan.needs_relayout
            else "none",
            padding=plan.padding,
            roundtrip_ms=1e3 * t_rt[0],
            roundtrip_spread_ms=[1e3 * t_rt[1], 1e3 * t_rt[2]],
            copy_ms=1e3 * t_copy[0],
            ratio_to_copy=t_rt[0] / t_copy[0],
            temp_bytes_per_device=temp,
            temp_over_shard=temp / shard_bytes,
        )
        rows.append(row)
    progress(len(cases), len(cases), "done")

    print(
        "| N | ndev | T_A | relayout | round trip ms | copy ms | ratio (<=3) | temp/shard (<=2) |"
    )
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
