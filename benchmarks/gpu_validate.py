"""One-command GPU validation (``nox -s gpu``, or ``python benchmarks/gpu_validate.py``).

Meant for an offline GPU machine that already has jax with its CUDA plugin, CUDA, cmake,
ninja, scikit-build-core and pybind11 (no nox or hatchling needed):

1. builds jaxmg-cuda with ``--no-build-isolation`` against what is installed; the two pure
   Python packages are used from the checkout (``PYTHONPATH``), so nothing is downloaded;
2. runs the GPU tests with ``JAXMG_REQUIRE_GPU=1`` (a missing GPU is a failure, not a skip):
   the CUDA layer outside XLA on the real libraries (``tests/native/test_cuda_host_calls.py``,
   the cases CI runs on its emulator), then through jax, the multi-process ones (CUDA IPC)
   included: one GPU per process where there are enough GPUs, and two processes on one GPU
   (refused with a reason) on any GPU machine;
3. asks cuSolverMg what it does with a device list that names one GPU twice (the question of
   two processes on one GPU; the answer, crash or hang included, goes into the log);
4. runs the GPU benchmark subset of issue 6 (potrs N=32768 and syevd N=16384 in float64, the
   tile sweep and the fixed-cost probe);
5. writes everything under ``benchmarks/results/<gpu>_<date>.*`` (``--results DIR`` elsewhere).

Every step has a deadline and the whole run a budget (``--budget``, 8 minutes: what one H100
call allows); steps that no longer fit are skipped and said so. A failing step does not stop
the others (only a failed build does); the summary lists each step's outcome and the exit
status is 1 when any step but the cuSolverMg experiment failed.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUDGET_S = 480  # the whole run: 8 minutes on one H100


class Steps:
    """Runs the steps in order under one overall budget. A failing step does not stop the
    ones after it (the first GPU run should bring back as much as it can); the build does,
    since nothing else can run without it. Everything goes to the console and the log."""

    min_step_s = 10  # a step with less time left than this is skipped

    def __init__(self, log, budget_s):
        self.log, self.end = log, time.monotonic() + budget_s
        self.outcomes = []

    def run(self, title, command, timeout, env, *, fatal=False, experiment=False):
        """``experiment``: the outcome, crash or hang included, is itself the result."""
        left = self.end - time.monotonic()
        if left < self.min_step_s:
            self._record(title, "skipped: out of time", "", experiment)
            return
        timeout = min(timeout, left)
        print(f"\n=== {title}: {' '.join(map(str, command))}", flush=True)
        started = time.monotonic()
        try:
            done = subprocess.run(
                [str(c) for c in command],
                cwd=ROOT,
                env=env,
                timeout=timeout,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            output = done.stdout
            outcome = "ok" if done.returncode == 0 else f"failed (exit {done.returncode})"
        except subprocess.TimeoutExpired as expired:
            output = expired.output or ""
            if isinstance(output, bytes):
                output = output.decode(errors="replace")
            outcome = f"timed out after {timeout:.0f} s"
        outcome += f", {time.monotonic() - started:.0f} s"
        print(output[-6000:], flush=True)
        self._record(title, outcome, output, experiment)
        if fatal and not outcome.startswith("ok"):
            raise SystemExit(self.summary())

    def _record(self, title, outcome, output, experiment):
        self.outcomes.append((title, outcome, experiment))
        self.log.write(f"\n=== {title}: {outcome}\n{output}")
        self.log.flush()

    def failed(self):
        return [
            t for t, o, experiment in self.outcomes if not experiment and not o.startswith("ok")
        ]

    def summary(self):
        lines = ["", "=== summary"]
        lines += [f"{outcome:<32} {title}" for title, outcome, _ in self.outcomes]
        text = "\n".join(lines)
        self.log.write(text + "\n")
        return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results",
        type=pathlib.Path,
        default=ROOT / "benchmarks" / "results",
        help="where the log, tables and plots go (default benchmarks/results)",
    )
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for everything")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "packages" / "jaxmg-layout" / "src"), str(ROOT / "packages" / "jaxmg" / "src")]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["JAXMG_REQUIRE_GPU"] = "1"
    gpu = subprocess.run(
        [
            sys.executable,
            "-c",
            "import jax; g = jax.devices('gpu'); print(len(g), g[0].device_kind)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    if gpu.returncode:
        print(gpu.stderr, file=sys.stderr)
        raise SystemExit("no GPU visible to jax: this command is for a GPU machine")
    count, _, name = gpu.stdout.strip().partition(" ")
    kind = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()
    # Several GPUs: the relayout runs, so compare the in-place one with JAX's collectives.
    relayouts = ["--relayouts", "native", "jax"] if int(count) > 1 else []
    args.results.mkdir(parents=True, exist_ok=True)
    stem = args.results / f"{kind}_{datetime.date.today().isoformat()}"
    with open(f"{stem}.log", "w") as log:
        steps = Steps(log, args.budget)
        steps.run(
            "build jaxmg-cuda",
            [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
            + ["--no-index", ROOT / "packages" / "jaxmg-cuda"],
            240,
            env,
            fatal=True,
        )
        pytest = [sys.executable, "-m", "pytest", "-q", "-rs", "--num-cpu-devices=1"]
        # First the CUDA layer alone, outside XLA (seconds), then everything through jax.
        steps.run(
            "the CUDA layer on the real libraries (no XLA)",
            pytest + ["tests/native/test_cuda_host_calls.py", "-k", "gpu"],
            120,
            env,
        )
        steps.run(
            "GPU tests",
            pytest + ["tests", "-k", "gpu", "--ignore=tests/native/test_cuda_host_calls.py"],
            300,
            # The multi-process GPU tests start processes of their own on the same GPUs.
            {**env, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
        )
        steps.run(
            "cuSolverMg with one GPU listed twice (can two processes share a GPU?)",
            [
                sys.executable,
                "-c",
                "import jax; jax.devices('gpu'); import jaxmg_cuda; "
                "print(jaxmg_cuda.probe_repeated_gpu(0))",
            ],
            60,
            env,
            experiment=True,
        )
        bench = [sys.executable, "benchmarks/solvers.py", "--runs", "3", "--warmup", "1"]
        steps.run(
            "potrs float64 N=32768",
            bench
            + ["--routines", "potrs", "--n", "8192", "16384", "32768", "--tiles", "1024"]
            + relayouts
            + ["--overhead-n", "64", "--json", f"{stem}.jsonl", "--markdown", f"{stem}.md"]
            + ["--plots", f"{stem}_plots"],
            240,
            env,
        )
        steps.run(
            "syevd float64 N=16384",
            bench
            + ["--routines", "syevd", "syevd_values", "--n", "16384", "--tiles", "1024"]
            + ["--overhead-n", "0", "--json", f"{stem}_syevd.jsonl"]
            + ["--markdown", f"{stem}_syevd.md", "--plots", f"{stem}_syevd_plots"],
            240,
            env,
        )
        print(steps.summary())
    print(f"\nresults: {stem}.*")
    return 1 if steps.failed() else 0


if __name__ == "__main__":
    raise SystemExit(main())
