"""``benchmarks/autodiff.py`` end to end at a tiny size: the Gaussian-process likelihood (value
and gradient), its data-fit term and the LU solve, each timed against JAX on one device and
checked against it, so the harness the derivative figures come from cannot quietly break."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("once_per_suite")


def test_tiny_run_passes_its_checks(tmp_path):
    out = tmp_path / "cases.jsonl"
    table = tmp_path / "cases.md"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "autodiff.py"),
            "--cpu-devices", "2",
            "--n", "64",
            "--runs", "1",
            "--warmup", "0",
            "--json", str(out),
            "--markdown", str(table),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["case"] for r in rows] == ["gp_nll", "gp_datafit", "k_nll", "k_datafit", "lu_solve"]
    for r in rows:
        assert r["check_passed"], r
        assert r["n"] == 64 and r["ndev"] == 2 and r["dtype"] == "float64"
        assert r["tolerance"] == 1e-6
    for r in rows[:4]:
        for impl in ("jaxmg", "jax"):
            for kind in ("value", "value_and_grad"):
                assert r[f"{impl}_{kind}_s"] > 0
        assert r["grad_rel_err"] <= 1e-6 and r["value_rel_err"] <= 1e-6
        assert r["jaxmg_grad_ratio"] > 0 and r["ratio_to_jax_value_and_grad"] > 0
    assert rows[4]["rel_err"] <= 1e-6 and rows[4]["jaxmg_s"] > 0 and rows[4]["jax_s"] > 0
    text = table.read_text()
    assert "| gp_nll | 64 |" in text and "| lu_solve | 64 |" in text
