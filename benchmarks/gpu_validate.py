"""One command on a GPU machine answers everything: ``nox -s gpu``, or, where there is no nox,
``python benchmarks/gpu_validate.py [--results DIR]``.

For an offline machine that already has jax with its CUDA plugin, CMake, ninja,
scikit-build-core and pybind11 (no nox, hatchling or internet needed; ``CXX`` may be any
compiler). In order, each step in a process of its own with a deadline:

1. build jaxmg-cuda (``pip install --no-build-isolation --no-index``) against what is
   installed; the two pure Python packages are used from the checkout (``PYTHONPATH``);
2. the CUDA layer outside XLA on the real libraries (``tests/native/test_cuda_host_calls.py``,
   the cases CI runs on its emulator; a case of more devices than there are GPUs lists the
   GPUs again, as cuSolverMg allows);
3. the GPU tests through jax (``tests -k gpu``, the multi-process ones included), with
   ``JAXMG_REQUIRE_GPU=1``: a missing GPU is a failure, not a skip;
4. the benchmark table (``benchmarks/gpu_bench.py``, one process per group: potrs with a tile
   sweep, backend ``"jax"``'s blocked engine forced on one GPU (potrs), syevd, lu_solve,
   cho_factor/cho_solve, a Gaussian process's value_and_grad, the fixed
   cost; on several GPUs also the device-count scaling and ``relayout="native"`` against
   ``"jax"``), each jaxmg row against JAX's own single-device solver in the same run;
5. backend ``"mp"`` (cuSOLVERMp over NCCL) in one process on a 1 x 1 grid
   (``benchmarks/mp_gpu_check.py``): every routine it runs on GPUs in four dtypes against
   numpy, the not-positive-definite and singular-LU statuses, the cuSOLVERMp release loaded,
   and potrs N = 16384 and syevd N = 8192 against JAX's own and ``backend="mg"``. With
   ``--cusolvermp-wheels DIR`` it first installs the cuSOLVERMp wheel(s) in ``DIR`` (``pip
   install --no-deps --no-index``): the machine is offline, so fill ``DIR`` beforehand with
   ``pip download --no-deps -d wheels 'nvidia-cusolvermp-cu13==0.8.0.3126'`` (22 MiB; 0.8.0 is
   the release that runs with the NCCL 2.28 GPU images ship; ``/wheels/`` is git-ignored, so a
   device call carries it by naming it: ``carry=["wheels"]``);
6. svd, qr, polar and lstsq with ``backend="mg"`` against JAX's own at N = 4096
   (``benchmarks/decompositions.py``; its table is in the log).

It leaves exactly two files, ``<gpu>_<date>.md`` (the machine, every step's outcome, every
test's, the benchmark tables, and all of it again as JSON lines at the end) and
``<gpu>_<date>.log`` (everything the steps printed), in ``benchmarks/results`` or ``--results``;
the results file is rewritten after every step, so a run stopped from outside keeps what it
did. A summary is printed at the end.

Time: the whole run has a budget (``--budget``, 540 s: one call of the lending machine, which
lends 15 minutes a session, its start included, and leaves time for a short rerun);
each step has a cap and leaves time for the ones after it; a step that no longer fits is
skipped and said so. A failing or hanging step (killed at its deadline with all its processes)
does not stop the others, except the build. The exit status is 1 when a step, a test or a
benchmark check failed.

``--smoke`` (CI, no GPU): the same run on two simulated CPU devices, without the build, with
the benchmark groups at tiny sizes and a stand-in test file (a pass, a failure, a skip) for the
first pytest step (the others are the same code), and the backend ``"mp"`` step on one CPU
device with ``backend="mg"`` (the LAPACK twin: ``"mp"`` on CPUs needs MPI).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUDGET_S = 540  # the whole run: 9 minutes on one H100 (480 s ran out in 2026-11-27's run)

# Each step's cap in seconds, and the time it leaves for the steps after it, from the first
# H100 run (issue 24): a call of potrs N=32768 takes 0.3 s, syevd N=8192 1.7-2.7 s, a compile
# a few seconds.
BUILD = (240, 300)
# The pytest steps: (title, arguments, cap, reserve). Each is a process of its own, so that a
# crash (on the H100 the first call crashed every process) loses one step's tests only.
PYTEST_STEPS = (
    (
        "the CUDA layer on the real libraries (no XLA)",
        ["tests/native/test_cuda_host_calls.py", "-k", "gpu and not emulator"],
        90,
        270,
    ),
    ("the GPU tests of jaxmg's API", ["tests/api", "-m", "gpu"], 180, 210),
    (
        "the native targets on GPUs through jax",
        ["tests/native", "-k", "gpu and not emulator"]
        + ["--ignore=tests/native/test_cuda_host_calls.py"],
        90,
        180,
    ),
    (
        "the multi-process GPU tests",
        ["tests/multiprocess", "-k", "gpu"],
        90,
        150,
    ),
)
BENCH = {
    "potrs": (110, 80),
    "blocked": (150, 60),
    "syevd": (80, 35),
    "factored": (70, 0),
    "scaling": (150, 0),
}
# The H200 ran the four at N = 4096 in about 110 s; an H100 had made svd's and qr's rows in 144 s.
DECOMPOSITIONS_S = 200
MP = (120, 80)  # backend "mp" on the one GPU: the checks, then two timings of three variants
MP_INSTALL = (60, 300)

# Packages whose versions the results record, where installed.
VERSIONS = (
    "jax",
    "jaxlib",
    "jax-cuda13-plugin",
    "jax-cuda13-pjrt",
    "jax-cuda12-plugin",
    "jax-cuda12-pjrt",
    "nvidia-cusolver",
    "nvidia-cusolver-cu12",
    "nvidia-cuda-runtime",
    "nvidia-cuda-runtime-cu12",
    "nvidia-nccl-cu13",
    "nvidia-nccl-cu12",
    "nvidia-cusolvermp-cu13",
    "nvidia-cusolvermp-cu12",
    "numpy",
    "scikit-build-core",
    "pybind11",
)


NOT_RUN = "not run (--smoke)"


class Steps:
    """Runs the steps in order under one overall budget, each in a process group of its own
    whose output goes to the log as it comes. A failing step does not stop the ones after it
    (the first GPU run should bring back as much as it can); a ``fatal`` one does (the build:
    nothing else runs without it). ``after_each`` is called after every step."""

    min_step_s = 10  # a step with less time than this is skipped

    def __init__(self, log_path, budget_s, after_each=None):
        self.log_path = pathlib.Path(log_path)
        self.end = time.monotonic() + budget_s
        self.outcomes = []
        self.after_each = after_each or (lambda: None)

    def left(self) -> float:
        return self.end - time.monotonic()

    def run(self, title, command, timeout, env, *, fatal=False, reserve=0.0) -> dict:
        """Runs ``command`` for at most ``timeout`` seconds, and never into the last
        ``reserve`` seconds of the budget (the steps after it need them)."""
        timeout = min(timeout, self.left() - reserve)
        if timeout < self.min_step_s:
            return self._record(title, "skipped: out of time", 0.0)
        command = [str(c) for c in command]
        print(f"\n=== {title}: {' '.join(command)}", flush=True)
        with open(self.log_path, "a") as log:
            log.write(f"\n=== {title}: {' '.join(command)}\n")
            log.flush()
            offset = log.tell()
            started = time.monotonic()
            process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: killed whole at the deadline
            )
            try:
                code = process.wait(timeout=timeout)
                outcome = "ok" if code == 0 else f"failed (exit {code})"
            except subprocess.TimeoutExpired:
                outcome = f"timed out after {timeout:.0f} s"
            finally:  # the step at its deadline, or what it left running, or on Ctrl-C
                _kill_group(process)
            seconds = time.monotonic() - started
        with open(self.log_path, errors="replace") as log:
            log.seek(offset)
            output = log.read()
        print(output[-6000:], end="" if output.endswith("\n") else "\n", flush=True)
        result = self._record(title, outcome, seconds)
        if fatal and outcome != "ok":
            raise SystemExit(self.summary())
        return result

    def not_run(self, title) -> dict:
        """A step that ``--smoke`` leaves out."""
        return self._record(title, NOT_RUN, 0.0)

    def _record(self, title, outcome, seconds) -> dict:
        result = {"kind": "step", "title": title, "outcome": outcome, "seconds": round(seconds, 1)}
        self.outcomes.append(result)
        with open(self.log_path, "a") as log:
            log.write(f"\n=== {title}: {outcome}, {seconds:.0f} s\n")
        self.after_each()
        return result

    def failed(self) -> list[str]:
        """The steps that did not succeed (skipped for lack of time included)."""
        return [o["title"] for o in self.outcomes if o["outcome"] not in ("ok", NOT_RUN)]

    def summary(self) -> str:
        lines = ["", "=== steps"]
        lines += [
            f"{o['outcome'] + ',':<28} {o['seconds']:>5.0f} s  {o['title']}" for o in self.outcomes
        ]
        text = "\n".join(lines)
        with open(self.log_path, "a") as log:
            log.write(text + "\n")
        return text


def _kill_group(process):
    """Kills every process left in the step's process group (the step's own process may have
    ended and left children)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


# --- what the machine is ---------------------------------------------------------------------

PROBE = """
import importlib.metadata, json, sys
import jax
devices = jax.devices()
out = {"python": sys.version.split()[0], "platform": devices[0].platform, "count": len(devices),
       "device_kind": devices[0].device_kind}
try:
    out["platform_version"] = devices[0].client.platform_version
except Exception:
    pass
for name in %r:
    try:
        out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pass
print(json.dumps(out))
"""


def probe(env, gpu: bool) -> dict:
    """The devices jax sees and the versions installed; raises SystemExit without a GPU when
    ``gpu``."""
    code = PROBE % (VERSIONS,)
    if gpu:
        code = code.replace("jax.devices()", "jax.devices('gpu')")
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env
        )
    except subprocess.TimeoutExpired:
        raise SystemExit("jax did not list its devices within 180 s") from None
    if done.returncode:
        print(done.stderr[-3000:], file=sys.stderr)
        if gpu:
            raise SystemExit("no GPU visible to jax: this command is for a GPU machine")
        raise SystemExit("jax could not list its devices")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _first_line(command, env=None) -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if done.returncode == 0 and text else None


def machine(env) -> dict:
    """What else the results should say about the machine (each item where it can be read)."""
    out = {}
    gpus = _first_line(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    )
    if gpus:
        out["nvidia-smi"] = gpus
    out["CXX"] = os.environ.get("CXX", "(unset: c++)")
    compiler = os.environ.get("CXX", "c++").split()
    out["compiler"] = _first_line([*compiler, "--version"]) or "(none found)"
    out["cmake"] = _first_line(["cmake", "--version"]) or "(none found)"
    commit = _first_line(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    if commit:
        changed = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.count("\n")
        out["commit"] = commit + (f" with {changed} changed file(s)" if changed else "")
    return out


EXPORTS = """
import pathlib, jaxmg_cuda
print(*sorted(pathlib.Path(jaxmg_cuda.__file__).parent.glob("_jaxmg_cuda*.so")), sep="\\n")
"""


def module_exports(env) -> dict:
    """The built module and how many libstdc++ symbols it exports (issue 24: a module that
    exported its static libstdc++ crashed at the first call on the H100's compiler)."""
    found = subprocess.run(
        [sys.executable, "-c", EXPORTS], capture_output=True, text=True, env=env, timeout=120
    )
    paths = found.stdout.split()
    if found.returncode or not paths:
        return {"module": "(not importable)"}
    out = {"module": paths[0]}
    if shutil.which("nm"):
        listed = subprocess.run(
            ["nm", "-D", "--defined-only", "-C", paths[0]], capture_output=True, text=True
        )
        names = [line.split(None, 2)[-1] for line in listed.stdout.splitlines() if line.strip()]
        out["exported symbols"] = len(names)
        out["exported std:: symbols"] = sum("std::" in name for name in names)
    return out


# --- test outcomes ---------------------------------------------------------------------------


def test_outcomes(junit_path, step) -> list[dict]:
    """One row per test of a pytest JUnit XML report: its outcome and the first line of its
    message."""
    rows = []
    for case in ElementTree.parse(junit_path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                if child.get("type") == "pytest.xfail":
                    outcome = "xfailed"
                message = (child.get("message") or child.text or "").strip()
                break
        rows.append(
            {
                "kind": "test",
                "step": step,
                "test": f"{case.get('classname', '')}::{case.get('name', '')}",
                "outcome": outcome,
                "seconds": float(case.get("time") or 0),
                "message": message.splitlines()[0][:400] if message else "",
            }
        )
    return rows


def pytest_step(steps, title, selection, limits, env, scratch, results):
    """A pytest step whose every test's outcome goes into ``results``."""
    junit = pathlib.Path(scratch) / f"junit-{len(steps.outcomes)}.xml"
    command = [sys.executable, "-m", "pytest", "-v", "-rfEs", "-p", "no:cacheprovider"]
    command += ["-o", "faulthandler_timeout=120", f"--junitxml={junit}", *selection]
    outcome = steps.run(title, command, limits[0], env, reserve=limits[1])
    if junit.exists():
        results.tests += test_outcomes(junit, title)
    elif not outcome["outcome"].startswith("skipped"):
        outcome["note"] = "no JUnit report: pytest did not finish (the log has how far it got)"
    results.write()


# --- the results file --------------------------------------------------------------------------


class Results:
    """Everything the run found, written to ``path`` as markdown whenever it grows."""

    def __init__(self, path, header):
        self.path, self.header = pathlib.Path(path), header
        self.machine, self.steps, self.tests, self.rows = {}, [], [], []

    def write(self):
        try:
            text = render(self)
        except Exception as err:  # noqa: BLE001 - the data is kept, in its simplest form
            text = f"(could not render the tables: {err!r})\n\n" + machine_readable(self)
        self.path.write_text(text)


def _ms(seconds) -> str:
    return f"{seconds * 1e3:.4g}"


def _mib(row, key) -> str:
    value = row.get("memory", {}).get(key)
    return "-" if value is None else f"{value / 2**20:.1f}"


def bench_table(rows) -> list[str]:
    baseline = {
        (r["group"], r["routine"], r["n"], r["dtype"], r["label"]): r["median_s"]
        for r in rows
        if r["variant"] == "jax" and "median_s" in r
    }
    out = [
        "| routine | N | dtype | variant | T_A | devices | relayout | engine | median ms "
        "(min..max) | vs JAX | TFLOP/s | check | compile s | program MiB | temp MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = r["routine"] + (f" ({r['label']})" if r["label"] else "")
        tile = "auto" if r["T_A"] is None else r["T_A"]
        if r["variant"] == "jax":  # JAX's own solver: no tile, one device, no relayout
            tile, relayout = "-", "-"
        else:
            relayout = r["relayout"]
        what = (
            f"| {name} | {r['n']} | {r['dtype']} | {r['variant']} | {tile} | {r['ndev']} | "
            f"{relayout} |"
        )
        if "skipped" in r or "error" in r:
            reason = r.get("skipped") or "ERROR " + r["error"].splitlines()[0][:300]
            out.append(f"{what} | {reason.replace('|', '/')} |" + " |" * 6)
            continue
        base = baseline.get((r["group"], r["routine"], r["n"], r["dtype"], r["label"]))
        ratio = f"{r['median_s'] / base:.2f}" if base else "-"
        calls = r.get("native_calls", 0)
        engine = "JAX" if r["variant"] == "jax" else (f"native x{calls}" if calls else "XLA")
        tflops = "-" if r.get("tflops") is None else f"{r['tflops']:.3g}"
        check = r["check"]
        verdict = f"{check.get('value', float('nan')):.2g} {'ok' if r['passed'] else 'FAILED'}"
        out.append(
            f"{what} {engine} | {_ms(r['median_s'])} ({_ms(r['min_s'])}..{_ms(r['max_s'])}) | "
            f"{ratio} | {tflops} | {verdict} | {r['compile_s']:.1f} | "
            f"{_mib(r, 'program_bytes')} | {_mib(r, 'temp_bytes')} |"
        )
    return out


GROUP_TITLES = {
    "potrs": "potrs (Cholesky solve), the tile sweep and the fixed cost",
    "syevd": "syevd (eigendecomposition), with vectors and values only",
    "factored": "lu_solve, cho_factor + cho_solve, cho_solve with a given factor, and a "
    "Gaussian process likelihood's value_and_grad",
    "scaling": "device-count scaling and the relayout (native: in place; jax: JAX collectives)",
    "mp": "backend mp (cuSOLVERMp over NCCL) on one GPU against mg (cuSolverMg) and JAX's own",
}


def render(results) -> str:
    h = results.header
    lines = [f"# jaxmg GPU validation: {h['title']}", ""]
    lines += [f"`{h['command']}`, started {h['started']}; {h['status']}", ""]
    lines += ["## Machine", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in results.machine.items()]
    lines += ["", "## Steps", "", "| step | outcome | seconds |", "|---|---|---|"]
    for s in results.steps:
        note = f" ({s['note']})" if s.get("note") else ""
        lines.append(f"| {s['title']} | {s['outcome']}{note} | {s['seconds']:.0f} |")
    lines += ["", "## Tests", ""]
    for step in dict.fromkeys(t["step"] for t in results.tests):
        mine = [t for t in results.tests if t["step"] == step]
        counts = {}
        for t in mine:
            counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
        lines += [f"### {step}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())), ""]
        bad = [t for t in mine if t["outcome"] in ("failed", "error")]
        lines += [f"- {t['outcome'].upper()} `{t['test']}`: {t['message']}" for t in bad]
        reasons = {}
        for t in mine:
            if t["outcome"] == "skipped":
                reasons[t["message"]] = reasons.get(t["message"], 0) + 1
        lines += [f"- skipped ({n}): {reason}" for reason, n in reasons.items()]
        lines.append("")
    if results.rows:
        lines += [
            "## Benchmarks",
            "",
            "Each case in three variants: `jax` (JAX's own solver on one device), `default` "
            '(jaxmg, `backend=None`) and `mg` (`backend="mg"`: cuSolverMg); `vs JAX` is the '
            "median's ratio to the `jax` row of the same case, `engine` says whether the "
            "compiled program calls jaxmg's native targets (how many) or is XLA's alone. "
            "Medians of the timed runs (min..max); the check is each case's scaled residual "
            "(limit 30) or relative error (1e-6); memory is XLA's analysis of the program, per "
            "device (a native call's workspace, from XLA's scratch allocator, is not in it).",
            "",
        ]
    for group in dict.fromkeys(r["group"] for r in results.rows if r["kind"] == "bench"):
        mine = [r for r in results.rows if r["kind"] == "bench" and r["group"] == group]
        lines += [f"### {GROUP_TITLES.get(group, group)}", "", *bench_table(mine), ""]
        for g in results.rows:
            if g["kind"] == "group" and g["group"] == group and g.get("bytes_limit"):
                lines += [
                    f"Device memory: peak {g['peak_bytes_in_use'] / 2**30:.1f} GiB of "
                    f"{g['bytes_limit'] / 2**30:.1f} GiB in this group's process.",
                    "",
                ]
    return "\n".join(lines) + "\n" + machine_readable(results)


def machine_readable(results) -> str:
    records = [{"kind": "run", **results.header, **results.machine}]
    records += results.steps + results.tests + results.rows
    body = "\n".join(json.dumps(r, default=str) for r in records)
    return f"## Machine-readable\n\nOne JSON object a line.\n\n```jsonl\n{body}\n```\n"


# --- the run -----------------------------------------------------------------------------------

SMOKE_TESTS = """
import pytest

def test_passes():
    assert 1 + 1 == 2

def test_fails():
    assert 1 + 1 == 3, "the stand-in failure"

def test_skips():
    pytest.skip("the stand-in skip")
"""


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--results",
        type=pathlib.Path,
        default=ROOT / "benchmarks" / "results",
        help="where the results file and the log go (default benchmarks/results)",
    )
    p.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for everything")
    p.add_argument("--smoke", action="store_true", help="CI: CPU devices, tiny sizes, no build")
    p.add_argument(
        "--cusolvermp-wheels",
        type=pathlib.Path,
        help="a folder of cuSOLVERMp wheels to install first (pip install --no-deps --no-index)",
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    started = time.monotonic()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "packages" / "jaxmg-layout" / "src"), str(ROOT / "packages" / "jaxmg" / "src")]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    if args.smoke:
        env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2")
    else:
        env["JAXMG_REQUIRE_GPU"] = "1"
    found = probe(env, gpu=not args.smoke)
    kind = re.sub(r"[^A-Za-z0-9]+", "-", found["device_kind"]).strip("-").lower()
    kind = "smoke-" + kind if args.smoke else kind
    count = found["count"]
    args.results.mkdir(parents=True, exist_ok=True)
    stem = args.results / f"{kind}_{datetime.date.today().isoformat()}"
    command = "python benchmarks/gpu_validate.py " + " ".join(argv or sys.argv[1:])
    header = {
        "title": f"{count} x {found['device_kind']}, {datetime.date.today().isoformat()}",
        "command": command.strip(),
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "status": "running",
        "budget_s": args.budget,
    }
    results = Results(f"{stem}.md", header)
    results.machine = {**found, **machine(env)}
    pathlib.Path(f"{stem}.log").write_text(f"{command}\n{json.dumps(results.machine)}\n")
    steps = Steps(f"{stem}.log", args.budget - (time.monotonic() - started), results.write)
    results.steps = steps.outcomes
    results.write()
    with tempfile.TemporaryDirectory(prefix="jaxmg-gpu-validate-") as scratch:
        try:
            run_steps(args, env, steps, results, scratch, count)
        finally:
            failed_rows = [r for r in results.rows if r["kind"] == "bench" and not r["passed"]]
            failed_tests = [t for t in results.tests if t["outcome"] in ("failed", "error")]
            verdict = (
                f"{len(steps.failed())} step(s), {len(failed_tests)} test(s) and "
                f"{len(failed_rows)} benchmark case(s) failed"
            )
            header["status"] = f"finished in {time.monotonic() - started:.0f} s: {verdict}."
            results.write()
            print(steps.summary())
            print(summary(results))
            print(f"\nresults: {stem}.md and {stem}.log")
    return 1 if steps.failed() or failed_rows or failed_tests else 0


def run_steps(args, env, steps, results, scratch, count):
    if args.smoke:
        steps.not_run("build jaxmg-cuda")
        stand_in = pathlib.Path(scratch) / "test_stand_in.py"
        stand_in.write_text(SMOKE_TESTS)
    else:
        steps.run(
            "build jaxmg-cuda",
            [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
            + ["--no-index", "-v", ROOT / "packages" / "jaxmg-cuda"],
            BUILD[0],
            env,
            fatal=True,
            reserve=BUILD[1],
        )
        results.machine.update(module_exports(env))
        if args.cusolvermp_wheels is not None:
            wheels = sorted(str(w) for w in args.cusolvermp_wheels.glob("*.whl"))
            steps.run(
                f"install cuSOLVERMp from {args.cusolvermp_wheels}",
                [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", *wheels]
                if wheels
                else [
                    sys.executable,
                    "-c",
                    f"raise SystemExit('no wheel in {args.cusolvermp_wheels}')",
                ],
                MP_INSTALL[0],
                env,
                reserve=MP_INSTALL[1],
            )
    # The multi-process GPU tests start processes of their own on the same GPUs.
    tests_env = {**env, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    for i, (title, selection, cap, reserve) in enumerate(PYTEST_STEPS):
        if args.smoke and i:
            steps.not_run(title)  # the same code as the first, which runs the stand-in
            continue
        if args.smoke:
            selection = [str(stand_in), "--rootdir", scratch]
        else:
            selection = ["--num-cpu-devices=1", *selection]
        pytest_step(steps, title, selection, (cap, reserve), tests_env, scratch, results)
    # Backend "mp" on the one GPU (cuSOLVERMp), in a process of its own.
    sink = pathlib.Path(scratch) / "mp.jsonl"
    command = [sys.executable, ROOT / "benchmarks" / "mp_gpu_check.py", "--json", sink]
    budget = min(MP[0], steps.left() - MP[1]) - 15
    command += ["--budget", f"{max(budget, 0):.0f}"] + (["--smoke"] if args.smoke else [])
    mp_env = {**env, "JAX_NUM_CPU_DEVICES": "1"} if args.smoke else env
    steps.run("backend mp (cuSOLVERMp) on one GPU", command, MP[0], mp_env, reserve=MP[1])
    if sink.exists():
        for row in map(json.loads, sink.read_text().splitlines()):
            (results.tests if row["kind"] == "test" else results.rows).append(row)
    results.write()
    groups = ["potrs", "blocked", "syevd", "factored"] + (["scaling"] if count > 1 else [])
    for group in groups:
        cap, reserve = BENCH[group]
        sink = pathlib.Path(scratch) / f"{group}.jsonl"
        command = [sys.executable, ROOT / "benchmarks" / "gpu_bench.py", group, "--json", sink]
        # The group starts no case past its budget; the step's deadline is the backstop.
        budget = min(cap, steps.left() - reserve) - 15
        command += ["--budget", f"{max(budget, 0):.0f}"] + (["--smoke"] if args.smoke else [])
        steps.run(f"benchmarks: {group}", command, cap, env, reserve=reserve)
        if sink.exists():
            results.rows += [json.loads(line) for line in sink.read_text().splitlines()]
        results.write()
    # svd, qr, polar, lstsq on cuSolverMg against JAX's own (issue 28); their table goes to
    # the log. --smoke leaves it out: tests/benchmarks/test_decompositions_bench.py runs it.
    title = "benchmarks: decompositions (svd, qr, polar, lstsq; the table is in the log)"
    if args.smoke:
        steps.not_run(title)
    else:
        command = [sys.executable, ROOT / "benchmarks" / "decompositions.py", "--backend", "mg"]
        command += ["--n", "4096", "--runs", "3"]
        steps.run(title, command, DECOMPOSITIONS_S, env)
        results.write()


def summary(results) -> str:
    lines = ["", "=== tests"]
    for step in dict.fromkeys(t["step"] for t in results.tests):
        mine = [t for t in results.tests if t["step"] == step]
        outcomes = [t["outcome"] for t in mine]
        counts = ", ".join(f"{outcomes.count(k)} {k}" for k in sorted(set(outcomes)))
        lines.append(f"{step}: {counts}")
        bad = [t for t in mine if t["outcome"] in ("failed", "error")]
        lines += [f"  {t['outcome'].upper()} {t['test']}: {t['message'][:160]}" for t in bad[:20]]
        if len(bad) > 20:
            lines.append(f"  ... and {len(bad) - 20} more (the results file lists them all)")
    lines += ["", "=== benchmarks (median ms; ratio to JAX on one device)"]
    bench = [r for r in results.rows if r["kind"] == "bench"]
    base = {
        (r["group"], r["routine"], r["n"], r["dtype"], r["label"]): r["median_s"]
        for r in bench
        if r["variant"] == "jax" and "median_s" in r
    }
    for r in bench:
        what = (
            f"{r['routine']:<16} {r['label'][:5]:<5} N={r['n']:<6} {r['dtype']:<8} "
            f"{r['variant']:<7} T_A={str(r['T_A']):<6} ndev={r['ndev']} {r['relayout']:<6}"
        )
        if "median_s" not in r:
            lines.append(f"{what} {r.get('skipped') or 'ERROR ' + r['error'][:120]}")
            continue
        ref = base.get((r["group"], r["routine"], r["n"], r["dtype"], r["label"]))
        ratio = f"{r['median_s'] / ref:5.2f}" if ref else "    -"
        verdict = "ok" if r["passed"] else "CHECK FAILED"
        lines.append(f"{what} {r['median_s'] * 1e3:10.4g} {ratio} {verdict}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
