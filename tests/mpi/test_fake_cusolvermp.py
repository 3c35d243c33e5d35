"""fakecuda's NCCL and cuSOLVERMp emulator (``tests/native/fake_cuda/fake_cusolvermp.cc``)
under ``mpiexec -n 2`` and ``-n 4`` (MPICH), driven directly with ctypes by
``fake_cusolvermp_worker.py``: potrf + potrs, getrf + getrs, syevd, geqrf + orgqr and gels on
1xP and 2x2 grids of both mappings against numpy, GetVersion, ncclAllReduce, a too-small
workspace refused as a violation, and nothing left alive. Runs in ``nox -s mpi``, which
installs ``mkl``, ``mpich`` and ``mpi4py``; skips elsewhere."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py", reason="the MPI engine's tests run in nox -s mpi")
pytestmark = pytest.mark.usefixtures("once_per_suite")

HERE = pathlib.Path(__file__).parent
WORKER = HERE / "fake_cusolvermp_worker.py"
MPIEXEC = pathlib.Path(sys.prefix) / "bin" / "mpiexec"


@pytest.fixture(scope="module")
def emulator(fake_cuda):
    """The emulator (tests/conftest.py)."""
    return fake_cuda / "libfakecuda.so"


@pytest.mark.parametrize("processes", [2, 4])
def test_fake_cusolvermp_under_mpiexec(emulator, tmp_path, processes):
    if not MPIEXEC.exists() and shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec (pip install mpich)")
    mpiexec = str(MPIEXEC if MPIEXEC.exists() else shutil.which("mpiexec"))
    done = subprocess.run(
        [mpiexec, "-n", str(processes), sys.executable, str(WORKER), str(emulator), tmp_path],
        capture_output=True,
        text=True,
        timeout=300,  # a rank that dies makes mpiexec end the job; this bounds the rest
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in range(processes):
        checks = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert len(checks) > 50, checks
        failed = [c for c in checks if not c["ok"]]
        assert not failed, (rank, failed)
