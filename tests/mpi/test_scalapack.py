"""MKL's ScaLAPACK from pip wheels under ``mpiexec`` (MPICH), on 1x2, 2x1 and 2x2 process
grids, with jaxmg_layout's 2D block-cyclic layout: the engine and the layout of jaxmg's coming
multi-node backend (issue 17), checked against numpy. Runs in ``nox -s mpi``, which installs
``mkl``, ``mpich`` and ``mpi4py``; skips elsewhere."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py", reason="the MPI engine's tests run in nox -s mpi")
pytestmark = pytest.mark.usefixtures("once_per_suite")

WORKER = pathlib.Path(__file__).with_name("worker.py")
MPIEXEC = pathlib.Path(sys.prefix) / "bin" / "mpiexec"


@pytest.mark.parametrize(("grid", "tile"), [("1x2", 3), ("2x1", 3), ("2x2", 2)])
def test_scalapack_on_the_2d_layout(tmp_path, grid, tile):
    if not MPIEXEC.exists() and shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec (pip install mpich)")
    mpiexec = str(MPIEXEC if MPIEXEC.exists() else shutil.which("mpiexec"))
    rows, cols = (int(v) for v in grid.split("x"))
    results = tmp_path / "results.jsonl"
    done = subprocess.run(
        [mpiexec, "-n", str(rows * cols), sys.executable, str(WORKER), grid, str(tile), results],
        capture_output=True,
        text=True,
        timeout=300,  # a rank that dies makes mpiexec end the job; this bounds the rest
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checks = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(checks) == 3 * 2, checks  # potrs, getrs, syevd x float64, complex128
    failed = [c for c in checks if not c["ok"]]
    assert not failed, failed
