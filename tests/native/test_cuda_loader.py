"""Which CUDA libraries jaxmg_cuda's loader maps into the process (``cuda::Load``).

jax's CUDA plugin loads one CUDA runtime before jaxmg's first GPU call; a second runtime
beside it would not share its contexts. The loader must keep to the runtime already in the
process, and never leave a runtime mapped whose cuSolverMg partner is missing. The libraries
here are stand-ins (``fake_cuda/stub_libs.cc``) with the real sonames and every symbol the
loader binds; each scenario runs in a fresh process, since the loader runs once per process.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import jaxmg_cuda

ROOT = Path(__file__).resolve().parents[2]
SONAMES = {
    "cuda12": ("libcudart.so.12", "libcusolverMg.so.11"),
    "cuda13": ("libcudart.so.13", "libcusolverMg.so.12"),
}

pytestmark = pytest.mark.skipif(
    not jaxmg_cuda.has_cuda_support(), reason="jaxmg_cuda was built without CUDA support"
)


@pytest.fixture(scope="module")
def stubs(tmp_path_factory, once_per_suite):
    """One stand-in per soname, each a file of its own (the dynamic loader tells libraries
    apart by file and by soname)."""
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the stand-in libraries")
    built = tmp_path_factory.mktemp("stubs")
    source = Path(__file__).parent / "fake_cuda" / "stub_libs.cc"
    for soname in sum(SONAMES.values(), ()):
        subprocess.run(
            [compiler, "-std=c++17", "-shared", "-fPIC", f"-Wl,-soname,{soname}"]
            + ["-I", str(ROOT / "packages" / "jaxmg-cuda" / "csrc")]
            + ["-o", str(built / soname), str(source)],
            check=True,
            timeout=120,
        )
    return built


def folder(stubs, tmp_path, name, *sonames):
    """A library folder holding copies of the stand-ins ``sonames``."""
    path = tmp_path / name
    path.mkdir()
    for soname in sonames:
        shutil.copy(stubs / soname, path / soname)
    return path


def load(tmp_path, dirs, preload=None):
    """Runs the loader in a fresh process after ``preload`` (as jax's CUDA plugin would);
    returns its error ('' on success) and the library files mapped afterwards."""
    script = textwrap.dedent(
        f"""
        import ctypes, json, sys
        from jaxmg_cuda import _jaxmg_cuda
        if {str(preload)!r} != "None":
            ctypes.CDLL({str(preload)!r}, mode=ctypes.RTLD_GLOBAL)
        _jaxmg_cuda.set_cuda_library_dirs({[str(d) for d in dirs]!r})
        error = _jaxmg_cuda.load_cuda_libraries()
        with open("/proc/self/maps") as f:
            mapped = sorted({{line.split()[-1] for line in f if "{tmp_path}" in line}})
        print(json.dumps({{"error": error, "mapped": mapped}}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["error"], {str(Path(p).relative_to(tmp_path)) for p in out["mapped"]}


def test_runtime_already_loaded_decides_the_version(stubs, tmp_path):
    """jax runs CUDA 12; a complete CUDA 13 pair comes first on the search path: the loader
    takes CUDA 12's cuSolverMg and maps nothing of CUDA 13."""
    d13 = folder(stubs, tmp_path, "d13", *SONAMES["cuda13"])
    d12 = folder(stubs, tmp_path, "d12", *SONAMES["cuda12"])
    error, mapped = load(tmp_path, [d13, d12], preload=d12 / "libcudart.so.12")
    assert error == ""
    assert mapped == {"d12/libcudart.so.12", "d12/libcusolverMg.so.11"}


def test_missing_partner_of_the_loaded_runtime_is_an_error(stubs, tmp_path):
    """jax runs CUDA 12 and only CUDA 13's libraries can be found: an error that names the
    missing library, rather than a second runtime."""
    d13 = folder(stubs, tmp_path, "d13", *SONAMES["cuda13"])
    d12 = folder(stubs, tmp_path, "d12", "libcudart.so.12")
    error, mapped = load(tmp_path, [d13], preload=d12 / "libcudart.so.12")
    assert "libcusolverMg.so.11" in error and "CUDA 12" in error, error
    assert "never loads a second CUDA runtime" in error
    assert mapped == {"d12/libcudart.so.12"}


def test_runtime_without_its_cusolvermg_is_released(stubs, tmp_path):
    """Nothing loaded yet; CUDA 13's runtime is found without its cuSolverMg, CUDA 12 is
    complete: CUDA 12 is used and the CUDA 13 runtime is unmapped again."""
    lone = folder(stubs, tmp_path, "lone13", "libcudart.so.13")
    d12 = folder(stubs, tmp_path, "d12", *SONAMES["cuda12"])
    error, mapped = load(tmp_path, [lone, d12])
    assert error == ""
    assert mapped == {"d12/libcudart.so.12", "d12/libcusolverMg.so.11"}


def test_newest_complete_pair_when_nothing_is_loaded(stubs, tmp_path):
    d13 = folder(stubs, tmp_path, "d13", *SONAMES["cuda13"])
    d12 = folder(stubs, tmp_path, "d12", *SONAMES["cuda12"])
    error, mapped = load(tmp_path, [d12, d13])
    assert error == ""
    assert mapped == {"d13/libcudart.so.13", "d13/libcusolverMg.so.12"}
