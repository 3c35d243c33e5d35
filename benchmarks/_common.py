"""Helpers shared by the benchmark scripts (timing, XLA's memory analysis, progress bar)."""

import os
import statistics
import sys
import time


def timed(fn, args, runs, warmup):
    import jax

    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), min(seconds), max(seconds)


def timed_pair(first, first_args, second, second_args, runs, warmup):
    """``(first's (median, min, max), second's, per-run ratios first / second)``: the two
    programs run alternately (which one goes first alternates too), so that a machine whose
    speed drifts (a shared one) slows both alike and the ratios of the pairs stay meaningful."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(first(*first_args))
        jax.block_until_ready(second(*second_args))
    times = ([], [])
    pair = ((first, first_args), (second, second_args))
    for run in range(runs):
        for k in (0, 1) if run % 2 == 0 else (1, 0):
            fn, args = pair[k]
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[k].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(*times, strict=True)]
    summary = [(statistics.median(t), min(t), max(t)) for t in times]
    return summary[0], summary[1], ratios


def timed_calls(fn, warmup, runs):
    """``(median, min, max)`` seconds of ``fn()`` (which waits for its own results)."""
    for _ in range(warmup):
        fn()
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), min(seconds), max(seconds)


def program_memory(compiled) -> dict:
    """XLA's memory analysis of a compiled program, bytes per device: its arguments, outputs,
    temporaries, what outputs share with arguments (``alias``), ``program`` (arguments +
    outputs - alias + temporaries) and XLA's own ``peak`` where this jaxlib reports it. Memory a
    native call takes from XLA's scratch allocator while it runs is in none of them."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        return {}
    out = {
        "argument_bytes": analysis.argument_size_in_bytes,
        "output_bytes": analysis.output_size_in_bytes,
        "alias_bytes": analysis.alias_size_in_bytes,
        "temp_bytes": analysis.temp_size_in_bytes,
    }
    out["program_bytes"] = (
        out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"] + out["temp_bytes"]
    )
    peak = getattr(analysis, "peak_memory_in_bytes", None)
    if peak:
        out["peak_bytes"] = peak
    return out


def start_mpi_jax():
    """jax in one process of an ``mpiexec`` job: CPU devices, float64, Gloo collectives,
    ``jax.distributed`` from MPI (mpi4py). Gloo writes to the C-level stdout, so Python's
    stdout moves to a copy of it and the C-level one goes to stderr (results stay parseable)."""
    sys.stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(cluster_detection_method="mpi4py")
    return jax


def progress(done, total, label):
    width = 30
    filled = int(width * done / max(total, 1))
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:40s}")
    sys.stderr.flush()
    if done == total:
        sys.stderr.write("\n")
