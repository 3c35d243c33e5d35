"""``benchmarks/gpu_validate.py`` (``nox -s gpu``) and ``benchmarks/gpu_bench.py`` on a machine
without a GPU.

A GPU machine is lent rarely and for minutes, so the code that only runs there must not first
fail there: its step runner is checked here with harmless commands, its report with a made-up
JUnit file, and the whole run end to end with ``--smoke`` (every benchmark group at tiny sizes
on two CPU devices, a stand-in test file for its pytest steps).
"""

import importlib.util
import json
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("once_per_suite")


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(ROOT / "benchmarks"))  # gpu_bench imports _common
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


@pytest.fixture(scope="module")
def gpu_validate():
    return load("gpu_validate")


@pytest.fixture(scope="module")
def gpu_bench():
    return load("gpu_bench")


def python(code):
    return [sys.executable, "-c", code]


def test_a_failing_step_does_not_stop_the_others(gpu_validate, tmp_path):
    log = tmp_path / "run.log"
    written = []
    steps = gpu_validate.Steps(log, budget_s=120, after_each=lambda: written.append(1))
    steps.run("fails", python("import sys; print('boom'); sys.exit(3)"), 60, None)
    steps.run("works", python("print('fine')"), 60, None)
    assert [(o["title"], o["outcome"]) for o in steps.outcomes] == [
        ("fails", "failed (exit 3)"),
        ("works", "ok"),
    ]
    assert steps.failed() == ["fails"]
    assert "boom" in log.read_text() and "fine" in log.read_text()
    assert len(written) == 2  # the results file is rewritten after every step


def alive(pid) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_hanging_step_is_killed_with_its_children_and_the_budget_skips_the_rest(
    gpu_validate, tmp_path
):
    """A step past its deadline is killed whole: the processes it started too (a GPU test's
    workers would otherwise hold the GPU for the steps after it)."""
    log = tmp_path / "run.log"
    steps = gpu_validate.Steps(log, budget_s=3)
    steps.min_step_s = 1
    hangs = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "print('CHILD-PID', child.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    steps.run("hangs", python(hangs), 300, None)
    steps.run("never runs", python("print('no')"), 30, None)
    (first, second) = steps.outcomes
    assert first["title"] == "hangs" and first["outcome"].startswith("timed out after")
    assert second == {**second, "title": "never runs", "outcome": "skipped: out of time"}
    assert steps.failed() == ["hangs", "never runs"]
    child = int(log.read_text().split("CHILD-PID ", 1)[1].split()[0])
    deadline = time.monotonic() + 60
    while alive(child) and time.monotonic() < deadline:  # SIGKILL has been sent: it goes
        time.sleep(0.1)
    assert not alive(child)
    assert "skipped: out of time" in steps.summary()


def test_a_step_leaves_the_reserve_to_the_steps_after_it(gpu_validate, tmp_path):
    steps = gpu_validate.Steps(tmp_path / "run.log", budget_s=100)
    steps.run("would eat the reserve", python("print('no')"), 60, None, reserve=95)
    assert steps.outcomes[0]["outcome"] == "skipped: out of time"
    steps.run("fits", python("print('yes')"), 60, None, reserve=50)
    assert steps.outcomes[1]["outcome"] == "ok"


def test_a_fatal_step_ends_the_run_with_the_summary(gpu_validate, tmp_path):
    steps = gpu_validate.Steps(tmp_path / "run.log", budget_s=60)
    with pytest.raises(SystemExit, match="failed \\(exit 2\\).*build"):
        steps.run("build", python("import sys; sys.exit(2)"), 30, None, fatal=True)


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="2" tests="5">
<testcase classname="tests.api.test_gpu" name="test_gpu_potrs[float64-cols]" time="1.5" />
<testcase classname="tests.api.test_gpu" name="test_gpu_lu_solve[float64-rows]" time="0.7">
  <failure message="AssertionError: 1&#10;second line">trace</failure></testcase>
<testcase classname="tests.native.test_native" name="test_getrf_getrs[gpu-float32]" time="0">
  <error message="failed on setup with RuntimeError: no library">trace</error></testcase>
<testcase classname="tests.multiprocess.test_multiprocess"
  name="test_every_routine_across_gpu_processes[2]" time="0">
  <skipped type="pytest.skip" message="needs 2 GPUs, found 1">skip</skipped></testcase>
<testcase classname="tests.api.test_gpu" name="test_known" time="0">
  <skipped type="pytest.xfail" message="known">xfail</skipped></testcase>
</testsuite></testsuites>
"""


def test_the_report_lists_every_test_and_each_failure_with_its_message(gpu_validate, tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    rows = gpu_validate.test_outcomes(junit, "the GPU tests through jax")
    assert [(r["test"].split("::")[1], r["outcome"], r["message"]) for r in rows] == [
        ("test_gpu_potrs[float64-cols]", "passed", ""),
        ("test_gpu_lu_solve[float64-rows]", "failed", "AssertionError: 1"),
        ("test_getrf_getrs[gpu-float32]", "error", "failed on setup with RuntimeError: no library"),
        ("test_every_routine_across_gpu_processes[2]", "skipped", "needs 2 GPUs, found 1"),
        ("test_known", "xfailed", "known"),
    ]
    results = gpu_validate.Results(
        tmp_path / "r.md", {"title": "t", "command": "c", "started": "s", "status": "done"}
    )
    results.tests = rows
    results.write()
    text = (tmp_path / "r.md").read_text()
    assert (
        "### the GPU tests through jax: 1 error, 1 failed, 1 passed, 1 skipped, 1 xfailed" in text
    )
    assert (
        "- FAILED `tests.api.test_gpu::test_gpu_lu_solve[float64-rows]`: AssertionError: 1" in text
    )
    assert "- skipped (1): needs 2 GPUs, found 1" in text
    records = machine_readable(text)
    assert [r["outcome"] for r in records if r["kind"] == "test"] == [r["outcome"] for r in rows]


def machine_readable(text):
    block = text.split("```jsonl\n", 1)[1].split("```", 1)[0]
    return [json.loads(line) for line in block.splitlines()]


def test_the_selections_name_files_that_exist(gpu_validate):
    """The pytest steps' paths (a typo there would only show on the GPU machine)."""
    for _, selection, _, _ in gpu_validate.PYTEST_STEPS:
        paths = [a.removeprefix("--ignore=") for a in selection if a.startswith(("tests", "--ig"))]
        assert paths and all((ROOT / path).exists() for path in paths), selection


def test_every_benchmark_is_measured_against_jax_in_the_same_run(gpu_bench):
    """Each jaxmg case of the full plan has JAX's row of the same routine, size and dtype in its
    group (the issue's rule), and the tiles respect what cuSolverMg accepted on the H100."""
    for group, ndev in (("potrs", 1), ("syevd", 1), ("factored", 1), ("scaling", 8)):
        cases = gpu_bench.plan(group, ndev)
        jax_rows = {(c.routine, c.n, c.dtype, c.label) for c in cases if c.variant == "jax"}
        for case in cases:
            assert (case.routine, case.n, case.dtype, case.label) in jax_rows, case
            if case.variant == "mg" and case.routine == "lu_solve":
                assert case.T_A is not None and case.T_A <= 512, case
            if case.variant == "mg" and case.routine.startswith("syevd"):
                assert case.T_A is None or case.T_A <= 1024, case
    sweep = [c.T_A for c in gpu_bench.plan("potrs", 1) if c.n == 32768 and c.dtype == "float64"]
    assert sweep == [None, None, None, 256, 512, 1024, 2048, 32768]  # jax, default, mg...
    assert {c.ndev for c in gpu_bench.plan("scaling", 8)} == {1, 2, 4, 8}
    assert {c.ndev for c in gpu_bench.plan("scaling", 3)} == {1, 2, 3}


def test_smoke_run_end_to_end(tmp_path):
    """The whole command on CPU devices: every benchmark group's code at tiny sizes, one
    results file and one log, the stand-in tests' failure and skip reported."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_validate.py"), "--smoke"]
        + ["--results", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2 and files[0].endswith(".log") and files[1].endswith(".md"), files
    text = (tmp_path / files[1]).read_text()
    # The stand-in test file's failure fails the run, and nothing else does.
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 step(s), 1 test(s) and 0 benchmark case(s) failed" in text, text[:3000]
    assert "AssertionError: the stand-in failure" in text and "the stand-in skip" in text
    records = machine_readable(text)
    steps = {r["title"]: r["outcome"] for r in records if r["kind"] == "step"}
    for group in ("potrs", "syevd", "factored", "scaling"):
        assert steps[f"benchmarks: {group}"] == "ok", steps
    # The backend "mp" step's code (on CPUs with backend "mg"): its checks and its timings.
    assert steps["backend mp (cuSOLVERMp) on one GPU"] == "ok", steps
    mp_tests = [r for r in records if r["kind"] == "test" and r["step"].startswith("backend mp")]
    assert len(mp_tests) == 4 * 6 + 2 and all(t["outcome"] == "passed" for t in mp_tests)
    mp_rows = {(r["routine"], r["variant"]) for r in records if r.get("group") == "mp"}
    assert mp_rows == {(r, v) for r in ("potrs", "syevd") for v in ("jax", "mg", "mp")}
    rows = [r for r in records if r["kind"] == "bench"]
    gpu_bench = load("gpu_bench")
    for group in ("potrs", "syevd", "factored", "scaling"):
        planned = [
            gpu_bench.Case(**{k: r[k] for k in gpu_bench.Case.__dataclass_fields__})
            for r in rows
            if r["group"] == group
        ]
        assert planned == gpu_bench.smoke_plan(group, 2), group
    for r in rows:
        assert r["passed"] and r["check"]["passed"], r
        assert r["median_s"] > 0 and r["memory"]["program_bytes"] > 0, r
        if r["variant"] == "jax":
            assert r["native_calls"] == 0, r
        if r["variant"] == "mg":  # backend="mg" runs jaxmg's native engine
            assert r["native_calls"] >= 1, r
    assert "=== benchmarks" in done.stdout and "=== steps" in done.stdout


def test_without_a_gpu_it_says_so_and_runs_nothing(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_validate.py"), "--results", tmp_path],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"},
    )
    assert done.returncode != 0
    assert "no GPU visible to jax" in done.stderr
    assert list(tmp_path.iterdir()) == []
