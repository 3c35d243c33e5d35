"""Backend ``"jax"`` on several devices (the engine of XLA's collectives) against backend
``"mg"`` (the LAPACK twin on CPUs) in the same run: ``potrs``, ``cho_factor`` + ``cho_solve`` and
``lu_factor`` + ``lu_solve`` of an ``N x N`` float64 ``A`` sharded by rows, jitted; compile time,
the best of ``--repeat`` warm runs, the ratio of times, XLA's memory analysis per device in
blocks of ``A`` (temporaries; arguments are one block; ``benchmarks/memory.py --backend jax``
measures whole programs, with ``A`` donated too), and the bytes the program's collectives
receive per device against the 1D lower bound (``N^2 / 2`` elements: every panel below the
diagonal, received once).

    python benchmarks/collectives.py --cpu-devices 4 --n 2048 4096
    python benchmarks/collectives.py --cpu-devices 4 --n 4096 --tile 16 --compile-only
"""

from __future__ import annotations

import argparse
import json
import re
import time

ROUTINES = ("potrs", "cho", "lu")


def collective_bytes(hlo: str, ndev: int) -> int:
    """Bytes the collectives of a compiled per-device program receive in one run, from its HLO
    text: an all-reduce of ``s`` bytes receives ``2 s (p - 1) / p`` (a ring: reduce-scatter,
    then all-gather), inside loops once per trip (the trip counts XLA knows:
    ``known_trip_count``)."""
    sizes = {"f64": 8, "c128": 16, "f32": 4, "c64": 8, "s32": 4, "pred": 1}
    computations, name, trips = {}, None, {}
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) ", line)
        if head and line.rstrip().endswith("{"):
            name = head.group(1)
            computations[name] = []
        elif name is not None:
            computations[name].append(line)
    for lines in computations.values():
        for line in lines:
            loop = re.search(r"while\(.*body=%?([\w.\-]+)", line)
            count = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
            if loop:
                trips[loop.group(1)] = int(count.group(1)) if count else 1

    def received(comp, seen=()):
        total = 0
        for line in computations.get(comp, []):
            if re.search(r"= .*\ball-reduce(-start)?\(", line):
                for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", line.split("all-reduce")[0]):
                    count = 1
                    for d in filter(None, dims.split(",")):
                        count *= int(d)
                    total += 2 * sizes.get(dtype, 0) * count * (ndev - 1) // ndev
            for callee in re.findall(
                r"(?:body|to_apply|calls|branch_computations)=\{?%?([\w.\-]+)", line
            ):
                if callee in computations and callee not in seen and callee != comp:
                    if "all-reduce" in line and "to_apply" in line:
                        continue
                    total += trips.get(callee, 1) * received(callee, (*seen, comp))
        return total

    entry = next(
        n for n in computations if hlo.find(f"ENTRY %{n} ") >= 0 or hlo.find(f"ENTRY {n} ") >= 0
    )
    return received(entry)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", nargs="+", type=int, default=[1024, 2048])
    p.add_argument("--routines", nargs="+", choices=ROUTINES, default=list(ROUTINES))
    p.add_argument("--tile", type=int, default=None, help="T_A (default: each engine's own)")
    p.add_argument("--cpu-devices", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--compile-only", action="store_true", help="compile times alone, no runs")
    args = p.parse_args(argv)
    import jax

    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg

    def program(routine, backend):
        def run(A, b):
            if routine == "potrs":
                return jaxmg.potrs(A, b, args.tile, backend=backend)
            if routine == "cho":
                return jaxmg.cho_solve(jaxmg.cho_factor(A, args.tile, backend=backend), b)
            return jaxmg.lu_solve(jaxmg.lu_factor(A, args.tile, backend=backend), b)

        return run

    mesh = jax.make_mesh((args.cpu_devices,), ("x",))
    ndev = args.cpu_devices
    for n in args.n:
        m = np.random.default_rng(0).standard_normal((n, n))
        a = m @ m.T / n + np.eye(n)
        block = n * n * 8 / ndev
        for routine in args.routines:
            rows = {}
            for backend in ("mg", "jax"):
                A = jax.device_put(a, NamedSharding(mesh, P("x", None)))
                b = jnp.ones(n)
                f = jax.jit(program(routine, backend))
                start = time.perf_counter()
                compiled = f.lower(A, b).compile()
                compile_s = time.perf_counter() - start
                if args.compile_only:
                    rows[backend] = {"compile_s": round(compile_s, 2)}
                    continue
                x = np.asarray(compiled(A, b))
                times = []
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    compiled(A, b).block_until_ready()
                    times.append(time.perf_counter() - start)
                row = {
                    "compile_s": round(compile_s, 2),
                    "run_s": round(min(times), 4),
                    "temp_blocks": round(compiled.memory_analysis().temp_size_in_bytes / block, 2),
                    "residual": float(
                        np.linalg.norm(a @ x - 1) / (np.linalg.norm(a) * np.linalg.norm(x))
                    ),
                }
                if backend == "jax":
                    bound = n * n * 8 / 2
                    row["received_over_bound"] = round(
                        collective_bytes(compiled.as_text(), ndev) / bound, 2
                    )
                rows[backend] = row
            row = {"routine": routine, "n": n, "devices": ndev, **rows}
            if not args.compile_only:
                row["jax_over_mg"] = round(rows["jax"]["run_s"] / rows["mg"]["run_s"], 2)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
