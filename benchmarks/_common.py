"""Helpers shared by the benchmark scripts (timing, progress bar)."""

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


def progress(done, total, label):
    width = 30
    filled = int(width * done / max(total, 1))
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:40s}")
    sys.stderr.flush()
    if done == total:
        sys.stderr.write("\n")
