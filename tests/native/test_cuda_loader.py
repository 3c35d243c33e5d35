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


# Loads cuSOLVERMp and NCCL (backend "mp" on GPUs), after the CUDA runtime and cuSolverMg.
LOAD_MP = """
try:
    _jaxmg_cuda.nccl_unique_id()
    error = ""
except RuntimeError as e:
    error = str(e)
"""


def load(tmp_path, dirs, preload=None, call="error = _jaxmg_cuda.load_cuda_libraries()"):
    """Runs the loader in a fresh process after ``preload`` (as jax's CUDA plugin would);
    returns its error ('' on success) and the library files mapped afterwards. ``call`` sets
    ``error``: the CUDA runtime and cuSolverMg by default."""
    script = "\n".join(
        [
            "import ctypes, json",
            "from jaxmg_cuda import _jaxmg_cuda",
            f"if {str(preload)!r} != 'None':",
            f"    ctypes.CDLL({str(preload)!r}, mode=ctypes.RTLD_GLOBAL)",
            f"_jaxmg_cuda.set_cuda_library_dirs({[str(d) for d in dirs]!r})",
            call,
            "with open('/proc/self/maps') as f:",
            f"    mapped = sorted({{line.split()[-1] for line in f if {str(tmp_path)!r} in line}})",
            "print(json.dumps({'error': error, 'mapped': mapped}))",
        ]
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


@pytest.fixture(scope="module")
def mp_stubs(tmp_path_factory, once_per_suite):
    """Stand-ins for backend "mp"'s libraries: an NCCL that loads, and a cuSOLVERMp that needs
    a symbol no library here defines (as cuSOLVERMp 0.9.1 for CUDA 13, through cuBLASMp 0.10,
    needed ncclCommQueryProperties, which the H100's NCCL 2.28 lacks)."""
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the stand-in libraries")
    built = tmp_path_factory.mktemp("mp_stubs")
    sources = {
        "libnccl.so.2": 'extern "C" int jaxmg_stub_nccl() { return 0; }\n',
        "libcusolverMp.so.0": (
            'extern "C" int ncclCommQueryProperties(void*, void*);\n'
            'extern "C" int jaxmg_stub_mp() { return ncclCommQueryProperties(0, 0); }\n'
        ),
    }
    for soname, text in sources.items():
        source = built / f"{soname}.cc"
        source.write_text(text)
        subprocess.run(
            [compiler, "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(built / soname)]
            + [str(source)],
            check=True,
            timeout=120,
        )
    return built


def test_mp_libraries_found_but_not_loadable_say_why(stubs, mp_stubs, tmp_path):
    """cuSOLVERMp is there but does not load (an undefined NCCL symbol): the error says it was
    found, gives the loader's reason and the versions needed, and does not call it missing."""
    d13 = folder(stubs, tmp_path, "d13", *SONAMES["cuda13"])
    mp = tmp_path / "mp"
    shutil.copytree(mp_stubs, mp)
    error, _ = load(tmp_path, [d13, mp], call=LOAD_MP)
    assert "found but could not all be loaded" in error, error
    assert f"{mp}/libcusolverMp.so.0: " in error and "ncclCommQueryProperties" in error, error
    assert "NCCL >= 2.29.2" in error, error
    assert "were not found" not in error and "Not found" not in error, error


def test_mp_libraries_not_found_say_so(stubs, tmp_path):
    """Neither NCCL nor cuSOLVERMp anywhere: the error says they were not found, and how to
    install them."""
    d13 = folder(stubs, tmp_path, "d13", *SONAMES["cuda13"])
    error, _ = load(tmp_path, [d13], call=LOAD_MP)
    if "could not all be loaded" in error:
        pytest.skip(f"a cuSOLVERMp or NCCL on this machine's loader path: {error}")
    assert "which were not found" in error and "libcusolverMp.so.0" in error, error
    assert "pip install nvidia-cusolvermp" in error, error
