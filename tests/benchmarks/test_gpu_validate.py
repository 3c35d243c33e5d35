"""``benchmarks/gpu_validate.py`` (``nox -s gpu``) on a machine without a GPU: its step runner.

The script has only ever been able to run on GPU machines, whose time is scarce, so how it
schedules and reports its steps is checked here with harmless commands.
"""

import importlib.util
import io
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("once_per_suite")


@pytest.fixture(scope="module")
def gpu_validate():
    spec = importlib.util.spec_from_file_location(
        "gpu_validate", ROOT / "benchmarks" / "gpu_validate.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def python(code):
    return [sys.executable, "-c", code]


def test_a_failing_step_does_not_stop_the_others(gpu_validate):
    log = io.StringIO()
    steps = gpu_validate.Steps(log, budget_s=60)
    steps.run("fails", python("import sys; print('boom'); sys.exit(3)"), 30, None)
    steps.run("works", python("print('fine')"), 30, None)
    steps.run("experiment", python("import sys; sys.exit(1)"), 30, None, experiment=True)
    assert [(t, o.split(",")[0]) for t, o, _ in steps.outcomes] == [
        ("fails", "failed (exit 3)"),
        ("works", "ok"),
        ("experiment", "failed (exit 1)"),
    ]
    assert steps.failed() == ["fails"]  # an experiment's outcome is a result, not a failure
    assert "boom" in log.getvalue() and "fine" in log.getvalue()


def test_a_hanging_step_times_out_and_the_budget_skips_the_rest(gpu_validate):
    steps = gpu_validate.Steps(io.StringIO(), budget_s=3)
    steps.min_step_s = 1
    steps.run("hangs", python("import time; time.sleep(60)"), 60, None)
    steps.run("never runs", python("print('no')"), 30, None)
    (title, outcome, _), (second, skipped, _) = steps.outcomes
    assert title == "hangs" and outcome.startswith("timed out after 3 s")
    assert second == "never runs" and skipped == "skipped: out of time"
    assert steps.failed() == ["hangs", "never runs"]
    assert "skipped: out of time" in steps.summary()


def test_a_fatal_step_ends_the_run_with_the_summary(gpu_validate):
    steps = gpu_validate.Steps(io.StringIO(), budget_s=60)
    with pytest.raises(SystemExit, match="failed \\(exit 2\\).*build"):
        steps.run("build", python("import sys; sys.exit(2)"), 30, None, fatal=True)


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
