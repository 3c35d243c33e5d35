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
5. writes everything under ``benchmarks/results/<gpu>_<date>.*``.

Every step has a deadline; the whole run is meant to fit in 8 minutes on one H100.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def step(title, command, timeout, env=None, log=None, *, required=True):
    """Runs one step under its deadline; a failure ends the run unless ``required=False``
    (an experiment whose outcome, crash or hang included, is itself the result)."""
    print(f"\n=== {title}: {' '.join(map(str, command))}", flush=True)
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
        output, code = done.stdout, done.returncode
    except subprocess.TimeoutExpired as expired:
        if required:
            raise
        output, code = f"{expired.output or ''}\nno answer within {timeout} s", "timeout"
    print(output[-6000:], flush=True)
    if log is not None:
        log.write(f"\n=== {title} (exit {code})\n{output}")
    if code and required:
        raise SystemExit(f"{title} failed with exit code {code}")
    return output


def main() -> int:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "packages" / "jaxmg-layout" / "src"), str(ROOT / "packages" / "jaxmg" / "src")]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["JAXMG_REQUIRE_GPU"] = "1"
    gpu = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.devices('gpu')[0].device_kind)"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    if gpu.returncode:
        print(gpu.stderr, file=sys.stderr)
        raise SystemExit("no GPU visible to jax: this command is for a GPU machine")
    kind = re.sub(r"[^A-Za-z0-9]+", "-", gpu.stdout.strip()).strip("-").lower()
    stem = RESULTS / f"{kind}_{datetime.date.today().isoformat()}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(f"{stem}.log", "w") as log:
        step(
            "build jaxmg-cuda",
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                ROOT / "packages" / "jaxmg-cuda",
            ],
            300,
            env,
            log,
        )
        step(
            "GPU tests",
            [
                sys.executable,
                "-m",
                "pytest",
                "tests",
                "-k",
                "gpu",
                "-q",
                "-rs",
                "--num-cpu-devices=1",
            ],
            360,
            # The multi-process GPU tests start processes of their own on the same GPUs.
            {**env, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"},
            log,
        )
        step(
            "cuSolverMg with one GPU listed twice (can two processes share a GPU?)",
            [
                sys.executable,
                "-c",
                "import jax; jax.devices('gpu'); import jaxmg_cuda; "
                "print(jaxmg_cuda.probe_repeated_gpu(0))",
            ],
            120,
            env,
            log,
            required=False,
        )
        bench = [
            sys.executable,
            "benchmarks/solvers.py",
            "--runs",
            "3",
            "--warmup",
            "1",
            "--json",
            f"{stem}.jsonl",
            "--markdown",
            f"{stem}.md",
            "--plots",
            f"{stem}_plots",
        ]
        step(
            "potrs float64 N=32768",
            bench[:2]
            + [
                "--routines",
                "potrs",
                "--n",
                "8192",
                "16384",
                "32768",
                "--tiles",
                "1024",
                "--overhead-n",
                "64",
            ]
            + bench[2:],
            240,
            env,
            log,
        )
        step(
            "syevd float64 N=16384",
            bench[:2]
            + [
                "--routines",
                "syevd",
                "syevd_values",
                "--n",
                "16384",
                "--tiles",
                "1024",
                "--overhead-n",
                "0",
            ]
            + [a.replace(".jsonl", "_syevd.jsonl").replace(".md", "_syevd.md") for a in bench[2:]],
            240,
            env,
            log,
        )
    print(f"\nresults: {stem}.*")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
