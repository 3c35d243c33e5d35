"""``benchmarks/solvers.py`` end to end at a tiny size: every case checks its own answer and
reports memory, so the harness the performance figures come from cannot quietly break."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("once_per_suite")


def test_tiny_sweep_passes_its_checks_and_reports_memory(tmp_path):
    out = tmp_path / "cases.jsonl"
    table = tmp_path / "cases.md"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "solvers.py"),
            "--cpu-devices", "2",
            "--routines", "potrs", "potri", "syevd",
            "--n", "48",
            "--tiles", "8",
            "--relayouts", "native", "jax",
            "--shardings", "cols", "rows",
            "--runs", "1",
            "--warmup", "0",
            "--overhead-n", "0",
            "--json", str(out),
            "--markdown", str(table),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 * 2 * 2
    for r in rows:
        assert r["check_passed"], r
        assert r["program_bytes"] > 0 and r["baseline_program_bytes"] > 0
        if r["routine"] == "potrs":  # no output of A's shape: donation cannot help
            assert "donated_program_bytes" not in r
            continue
        # The result takes over A's buffer. Where the solver's block is A transposed (syevd on
        # columns), jax 0.12's XLA:CPU keeps a copy anyway: no saving, but never a loss.
        assert r["donated_alias_bytes"] > 0, r
        assert r["donated_program_bytes"] <= r["program_bytes"], r
        if r["routine"] == "potri" or r["sharding"] == "rows":
            assert r["donated_program_bytes"] < r["program_bytes"], r
    assert table.read_text().count("\n| potri |") == 4


def test_one_device_runs_both_engines_against_jax(tmp_path):
    """The one-device cases nox -s bench runs: jaxmg's default (JAX's dense solvers) and
    backend="mg", each checked and against the baseline, and the fixed cost of both."""
    out = tmp_path / "one.jsonl"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "solvers.py"),
            "--cpu-devices", "1",
            "--routines", "potri", "syevd_values", "lu_solve", "cho_solve",
            "--n", "32",
            "--tiles", "0",
            "--backends", "default", "mg",
            "--runs", "1",
            "--warmup", "0",
            "--overhead-n", "16",
            "--json", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    rows = [r for r in lines if "routine" in r]
    assert sorted((r["routine"], r["backend"]) for r in rows) == sorted(
        (routine, backend)
        for routine in ("potri", "syevd_values", "lu_solve", "cho_solve")
        for backend in ("default", "mg")
    )
    assert all(r["check_passed"] and r["ndev"] == 1 and r["T_A"] == 0 for r in rows), rows
    fixed = [r for r in lines if "overhead_potrs_us" in r]
    assert sorted(r["backend"] for r in fixed) == ["default", "mg"]
    assert all(r["overhead_potrs_us"] > 0 and r["baseline_us"] > 0 for r in fixed), fixed
