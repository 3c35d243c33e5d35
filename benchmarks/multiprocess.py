"""The multi-process mode against the single-process mode, on CPU, in one run.

    python benchmarks/multiprocess.py [--processes 2] [--n 64 1024 2048] [--tile 128]
                                      [--json benchmarks/results/multiprocess_cpu.jsonl]

For each N, jaxmg.potrs (float64, one right-hand side, A sharded by columns) runs on P CPU
devices twice: driven by one process (baseline: the in-process rendezvous, XLA's in-process
collectives) and by P processes of one jax.distributed job, one device each (shared-memory
rendezvous, gloo collectives over localhost). Prints median milliseconds and the ratio
processes / one process; N=64 shows the fixed cost per call.
"""

import argparse
import json
import os
import socket
import subprocess
import sys


def measure(args, devices_per_process):
    """Process 0's timings as {n: (median, min, max)} seconds."""
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", devices_per_process)
    jax.config.update("jax_enable_x64", True)
    if args.processes_now > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"127.0.0.1:{args.port}", args.processes_now, args.process_id)
    import numpy as np
    from _common import timed
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg

    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    out = {}
    for n in args.n:
        rng = np.random.default_rng(n)
        m = rng.standard_normal((n, n))
        A_np = m @ m.T / n + np.eye(n)
        A = jax.make_array_from_callback(
            (n, n), NamedSharding(mesh, P(None, "x")), lambda i, A_np=A_np: A_np[i]
        )
        b = jax.make_array_from_callback(
            (n, 1), NamedSharding(mesh, P()), lambda i, n=n: np.ones((n, 1))[i]
        )
        tile = min(args.tile, n // jax.device_count())
        out[n] = timed(lambda a, b, t=tile: jaxmg.potrs(a, b, t), (A, b), args.runs, args.warmup)
    return out


def launch(args, processes, devices_per_process):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = [sys.executable, __file__, "--child", "--port", str(port)]
    common += ["--processes-now", str(processes), "--devices-per-process", str(devices_per_process)]
    common += ["--n", *map(str, args.n), "--tile", str(args.tile)]
    common += ["--runs", str(args.runs), "--warmup", str(args.warmup)]
    procs = [
        subprocess.Popen(common + ["--process-id", str(i)], stdout=subprocess.PIPE, text=True)
        for i in range(processes)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a benchmark process failed: {[p.returncode for p in procs]}")
    line = [x for x in outs[0].splitlines() if x.startswith("{")][-1]
    return {int(k): v for k, v in json.loads(line).items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--n", type=int, nargs="+", default=[64, 1024, 2048])
    parser.add_argument("--tile", type=int, default=128)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", help="append one JSON line per case to this file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--process-id", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--processes-now", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--devices-per-process", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args, args.devices_per_process)), flush=True)
        os._exit(0)  # skip the distributed shutdown barrier

    one = launch(args, 1, args.processes)
    many = launch(args, args.processes, 1)
    print(f"potrs float64, {args.processes} CPU devices, tile {args.tile}, median of {args.runs}")
    print("| N | one process ms | one device per process ms | ratio |")
    print("|---|---|---|---|")
    for n in args.n:
        base, mp = one[n][0] * 1e3, many[n][0] * 1e3
        print(f"| {n} | {base:.2f} | {mp:.2f} | {mp / base:.2f} |")
        if args.json:
            row = {"routine": "potrs", "n": n, "devices": args.processes, "tile": args.tile}
            row.update(one_process_ms=base, processes_ms=mp, ratio=mp / base)
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
