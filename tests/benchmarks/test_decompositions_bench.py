"""``benchmarks/decompositions.py`` end to end at a tiny size: each routine timed against JAX
on one device, its memory analysed, and its accuracy at condition numbers 1 to 1e12 within a
small multiple of JAX's own, so the harness the issue-28 figures come from cannot quietly
break."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("once_per_suite")


def test_tiny_run(tmp_path):
    out = tmp_path / "cases.jsonl"
    table = tmp_path / "cases.md"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "decompositions.py"),
            "--cpu-devices", "2",
            "--n", "32",
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
    assert [r["routine"] for r in rows] == ["svd", "qr", "polar", "lstsq"]
    for r in rows:
        assert r["ndev"] == 2 and r["n"] == 32 and r["ratio"] > 0
        assert r["jaxmg_blocks"] > 0 and r["jaxmg_blocks_cols"] > 0
        for cond in ("1", "10000", "1e+08", "1e+12"):
            ours, theirs = r[f"cond_{cond}"]["jaxmg"], r[f"cond_{cond}"]["jax"]
            for x, y in zip(ours, theirs, strict=True):
                assert x <= max(10 * y, 1e-13), (r["routine"], cond, ours, theirs)
    assert table.read_text().startswith("# svd, qr, polar, lstsq")
