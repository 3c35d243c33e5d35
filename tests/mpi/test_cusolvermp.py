"""Backend "mp"'s GPU engine (csrc/engines/cusolvermp.cc) under ``mpiexec``, outside XLA, against
the emulator of the CUDA runtime, NCCL and cuSOLVERMp (tests/native/fake_cuda, numbers from MKL's
ScaLAPACK): every routine and dtype on 1x1, 1x2, 2x1, 2x2 and 1x4 process grids against numpy, a
matrix that is not positive definite, what cuSOLVERMp 0.9 cannot do refused with the reason,
and no misuse of the libraries (``cusolvermp_worker.py``); the rectangular routines (qr, gels)
and the version read alike (``cusolvermp_rect_worker.py``). NOT A GPU RUN: it proves the
engine's plumbing against the emulator's reading of the libraries. Runs in ``nox -s mpi``,
which installs ``mkl``, ``mpich`` and ``mpi4py``; skips elsewhere."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import jaxmg_cuda

pytest.importorskip("mpi4py", reason="the MPI engine's tests run in nox -s mpi")
pytestmark = [
    pytest.mark.usefixtures("once_per_suite"),
    pytest.mark.skipif(not jaxmg_cuda.has_cuda_support(), reason="built without CUDA support"),
]

WORKER = pathlib.Path(__file__).with_name("cusolvermp_worker.py")
MPIEXEC = pathlib.Path(sys.prefix) / "bin" / "mpiexec"
CHECKS = 4 * 5 + 6  # per dtype: potrs, its factor, potrf + potrs_factored, LU, syevd; then 6


def run_ranks(worker, grid, arguments, emulator, results, expected):
    """``worker`` under ``mpiexec`` on a ``grid`` of ranks ("RxC"), with ``arguments``, the
    emulator's folder and a results folder; every rank's checks, ``expected`` of them, pass."""
    if not MPIEXEC.exists() and shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec (pip install mpich)")
    mpiexec = str(MPIEXEC if MPIEXEC.exists() else shutil.which("mpiexec"))
    rows, cols = (int(v) for v in grid.split("x"))
    done = subprocess.run(
        [mpiexec, "-n", str(rows * cols), sys.executable, str(worker), grid, *map(str, arguments)]
        + [str(emulator), str(results)],
        capture_output=True,
        text=True,
        timeout=300,  # a rank that dies makes mpiexec end the job; this bounds the rest
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in range(rows * cols):
        lines = (results / f"{rank}.jsonl").read_text().splitlines()
        checks = [json.loads(line) for line in lines]
        assert len(checks) == expected, checks
        failed = [c for c in checks if not c["ok"]]
        assert not failed, (rank, failed)


@pytest.mark.parametrize(
    ("grid", "tile", "n"),
    [("1x1", 3, 7), ("1x2", 3, 12), ("2x1", 3, 12), ("2x2", 2, 10), ("1x4", 2, 9)],
)
def test_cusolvermp_engine_on_the_emulator(fake_cuda, tmp_path, grid, tile, n):
    run_ranks(WORKER, grid, (tile, n), fake_cuda, tmp_path, CHECKS)


RECT_WORKER = pathlib.Path(__file__).with_name("cusolvermp_rect_worker.py")
RECT_CHECKS = 4 * 6 + 3  # per dtype: qr tall and wide, qr in blocks three ways, gels; then 3


@pytest.mark.parametrize(("grid", "tile"), [("1x1", 3), ("1x2", 2), ("2x1", 3), ("2x2", 2)])
def test_cusolvermp_rectangular_routines_on_the_emulator(fake_cuda, tmp_path, grid, tile):
    """qr (Geqrf + Orgqr) and gels (Gels) of csrc/engines/cusolvermp_rect.cc, per rank."""
    refusal = grid != "1x1"  # a tile wider than a block, where an axis is sharded
    run_ranks(RECT_WORKER, grid, (tile,), fake_cuda, tmp_path, RECT_CHECKS + refusal)
