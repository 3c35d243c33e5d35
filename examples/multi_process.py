"""jaxmg in a multi-process jax.distributed job, on CPU (no GPU needed).

    python examples/multi_process.py                           # 2 processes x 1 device
    python examples/multi_process.py --processes 4
    python examples/multi_process.py --devices-per-process 2   # the multi-node recipe

Run without ``--process-id`` it launches the job itself (like ``srun``/``mpirun`` would) and
prints each process's output. With one device per process, jaxmg solves across the processes
(the multi-process mode). With several devices per process, each process stands for one node:
``host_mesh`` + ``gather_to_hosts`` put all of A on every process's devices and each solves
there (the multi-node recipe). Each process prints True when its solution is right.
"""

import argparse
import os
import socket
import subprocess
import sys


def launch(args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--process-id", str(i), "--port", str(port)]
            + ["--processes", str(args.processes)]
            + ["--devices-per-process", str(args.devices_per_process)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(args.processes)
    ]
    failed = False
    for i, p in enumerate(procs):
        out, err = p.communicate(timeout=300)
        print(f"=================== process {i} output ===================", flush=True)
        print(out, end="", flush=True)
        sys.stderr.write("".join(line for line in err.splitlines(True) if "[Gloo]" not in line))
        failed |= p.returncode != 0
    return 1 if failed else 0


def run(args):
    # Gloo (the CPU collectives) prints its connection messages to the C-level stdout, at times
    # in the middle of a line of ours: they go to stderr, and this script's prints keep stdout.
    sys.stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", args.devices_per_process)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives
    jax.config.update("jax_enable_x64", True)
    jax.distributed.initialize(f"127.0.0.1:{args.port}", args.processes, args.process_id)

    import jax.numpy as jnp
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jaxmg

    N, T_A = 8 * jax.device_count(), 2
    diagonal = jnp.arange(1, N + 1, dtype=jnp.float64)
    if args.devices_per_process == 1:
        mesh = jax.make_mesh((jax.device_count(),), ("x",))  # one device per process
        spec = P(None, "x")
    else:
        mesh = jaxmg.host_mesh()  # ("host", "x"): row p = process p's devices
        spec = P(None, ("host", "x"))
    A = jax.jit(jnp.diag, out_shardings=NamedSharding(mesh, spec))(diagonal)
    if args.devices_per_process > 1:
        A = jaxmg.gather_to_hosts(A, mesh)  # every process holds all of A on its devices
    b = jax.device_put(jnp.ones((N, 1)), NamedSharding(mesh, P()))
    x = jaxmg.potrs(A, b, T_A=T_A)
    x = multihost_utils.process_allgather(x, tiled=True)
    print(f"process {jax.process_index()} of {jax.process_count()}, A sharded {A.sharding.spec}")
    print(bool(jnp.allclose(x.ravel(), 1.0 / diagonal)))
    sys.stdout.flush()
    jax.distributed.shutdown()  # leave together: process 0 hosts the coordination service
    os._exit(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices-per-process", type=int, default=1)
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--port", type=int)
    arguments = parser.parse_args()
    sys.exit(launch(arguments) if arguments.process_id is None else run(arguments))
