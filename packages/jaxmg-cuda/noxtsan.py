"""``nox -s tsan``: the rendezvous and the CPU twin under ThreadSanitizer.

Builds jaxmg-cuda with ``-fsanitize=thread`` (CMake option ``JAXMG_TSAN``), preloads the
sanitizer runtime into the (uninstrumented) Python interpreter, and runs the multi-device
native tests on 4 and 8 simulated devices. Reports go to ``tsan-reports/`` in the session's
temporary folder; any report fails the session. Only our library is instrumented, so races
inside XLA itself are out of scope (``ignore_noninstrumented_modules``).
"""

import pathlib
import subprocess

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent.parent


def _libtsan() -> str:
    found = subprocess.run(
        ["gcc", "-print-file-name=libtsan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not pathlib.Path(found).is_file():
        raise RuntimeError("ThreadSanitizer runtime (libtsan.so) not found; install gcc's libtsan")
    return str(pathlib.Path(found).resolve())


def tsan(session):
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
        "LD_PRELOAD": _libtsan(),
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
