"""``nox -s tsan`` and ``nox -s asan``: jaxmg-cuda under ThreadSanitizer and AddressSanitizer.

``tsan``: the rendezvous and the CPU twin.

Builds jaxmg-cuda with ``-fsanitize=thread`` (CMake option ``JAXMG_TSAN``), preloads the
sanitizer runtime into the (uninstrumented) Python interpreter, and runs the multi-device
native tests on 4 and 8 simulated devices. Reports go to ``tsan-reports/`` in the session's
temporary folder; any report fails the session. Only our library is instrumented, so races
inside XLA itself are out of scope (``ignore_noninstrumented_modules``).

``asan``: the CUDA layer (csrc/engines/cusolvermg.cc, csrc/platforms/cuda_targets.cc and the
shared protocol, in one process and across processes) on the CUDA emulator, through
``tests/native/test_cuda_host_calls.py``, whose calls run in processes that never start jax's
backend: jaxlib's C++ exceptions trip ASan's ``__cxa_throw`` interceptor, so the jax-driven
tests cannot run under it.
"""

import pathlib
import subprocess

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent.parent


def _runtime(name: str) -> str:
    found = subprocess.run(
        ["gcc", f"-print-file-name={name}"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not pathlib.Path(found).is_file():
        raise RuntimeError(f"sanitizer runtime {name} not found; install gcc's sanitizer libraries")
    return str(pathlib.Path(found).resolve())


def _install_build_deps(session):
    session.install(
        "scikit-build-core>=0.10",
        "pybind11>=2.13",
        "jax>=0.10",
        "jaxlib>=0.10",
        "ninja",
        "cmake",
        "numpy",
        "scipy",
        "pytest",
        "hypothesis",
    )
    # Pure Python: the tests compute the in-place relayout's moves with it.
    session.install(str(HERE.parent / "jaxmg-layout"))


def asan(session):
    _install_build_deps(session)
    flags = "-fsanitize=address -fno-omit-frame-pointer -g"
    session.install(
        "--no-build-isolation",
        "-C",
        f"cmake.define.CMAKE_CXX_FLAGS={flags}",
        "-C",
        # MODULE: CMAKE_SHARED_LINKER_FLAGS does not reach a pybind11 module.
        "cmake.define.CMAKE_MODULE_LINKER_FLAGS=-fsanitize=address",
        "-C",
        "build-dir=build/asan",
        str(HERE),
    )
    # An ASan report aborts the subprocess, which fails its test.
    session.run(
        "python",
        "-m",
        "pytest",
        str(ROOT / "tests" / "native" / "test_cuda_host_calls.py"),
        "-q",
        "--num-cpu-devices=4",
        env={"LD_PRELOAD": _runtime("libasan.so"), "ASAN_OPTIONS": "detect_leaks=0"},
    )
    session.log("AddressSanitizer: no reports")


def tsan(session):
    _install_build_deps(session)
    session.install(
        "--no-build-isolation",
        "-C",
        "cmake.define.JAXMG_TSAN=ON",
        "-C",
        "build-dir=build/tsan",
        str(HERE),
    )
    reports = pathlib.Path(session.create_tmp()) / "tsan-reports"
    reports.mkdir(exist_ok=True)
    env = {
        "LD_PRELOAD": _runtime("libtsan.so"),
        "TSAN_OPTIONS": f"log_path={reports}/report ignore_noninstrumented_modules=1 "
        "halt_on_error=0 report_signal_unsafe=0",
    }
    for count in session.posargs or ["4", "8"]:
        session.run(
            "python",
            "-m",
            "pytest",
            str(ROOT / "tests" / "native"),
            "-q",
            "-x",
            f"--num-cpu-devices={count}",
            "-k",
            "not fault and not missing",
            env=env,
        )
    found = sorted(reports.glob("report*"))
    if found:
        for path in found:
            session.log(path.read_text()[:4000])
        session.error(f"ThreadSanitizer reported {len(found)} problem(s)")
    session.log("ThreadSanitizer: no reports")
