"""The self-tests of ``cuda_abi.py``: the checks must fail, naming the culprit, on headers with
one change, on wheels paired with the other CUDA major, on an NCCL lacking a function
cuSOLVERMp imports; and CMake's header gate must skip bad header sets."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from declaration_checks import (
    CHECK_SOURCE,
    CSRC,
    MP_CHECK_SOURCE,
    check_nccl_imports,
    check_needs,
    compile_check,
)
from nvidia_wheels import (
    MP_RELEASES,
    PACKAGE,
    CheckFailed,
    include_dirs,
)

# --- Self-tests --------------------------------------------------------------------------------

# (header, pattern, replacement, what the compile error must name). A header of csrc/ (named
# by its path there) is a change to our declarations, any other one to NVIDIA's.
MUTATIONS = (
    ("cusolverMg.h", r"\bint(\s+)deviceId\[\]", r"const int\1deviceId[]", "cusolverMgDeviceSelect"),
    # (the first `int64_t *lwork)` in cusolverMg.h is cusolverMgSyevd_bufferSize's)
    (
        "cusolverMg.h",
        r"int64_t(\s*)\*(\s*)lwork\)",
        "int32_t *lwork)",
        "cusolverMgSyevd_bufferSize",
    ),
    ("library_types.h", r"CUDA_C_64F(\s*)=(\s*)5", "CUDA_C_64F = 6", "CUDA_C_64F"),
    (
        "driver_types.h",
        r"cudaMemcpyDefault(\s*)=(\s*)4",
        "cudaMemcpyDefault = 5",
        "cudaMemcpyDefault",
    ),
    (
        "cuda_runtime_api.h",
        r"cudaGetErrorString\(cudaError_t error\)",
        "cudaGetErrorString(int error)",
        "cudaGetErrorString",
    ),
    (
        "cuda.h",
        r"\Z",
        "\n#define cuPointerGetAttribute cuPointerGetAttribute_v2\n"
        "CUresult cuPointerGetAttribute_v2(void*, CUpointer_attribute, CUdeviceptr);\n",
        "cuPointerGetAttribute",
    ),
)
MP_MUTATIONS = (
    # The communicator: cuSOLVERMp < 0.7 took a cal_comm_t here.
    ("cusolverMp.h", r"const ncclComm_t(\s+)comm", r"void*\1comm", "cusolverMpCreateDeviceGrid"),
    ("cusolverMp.h", r"uint32_t(\s+)RSRC_A", r"int32_t\1RSRC_A", "cusolverMpCreateMatrixDesc"),
    # (the first `jobu` in cusolverMp.h 0.9 is cusolverMpGesvd_bufferSize's: the GESVD list)
    ("cusolverMp.h", r"cusolverEigMode_t(\s+)jobu", r"int\1jobu", "cusolverMpGesvd_bufferSize"),
    # (the first `char* jobz` in cusolverMp.h is cusolverMpSyevd_bufferSize's)
    ("cusolverMp.h", r"char\*(\s+)jobz", r"const char*\1jobz", "cusolverMpSyevd_bufferSize"),
    (
        "cusolverMp.h",
        r"CUSOLVERMP_GRID_MAPPING_ROW_MAJOR(\s*)=(\s*)1",
        "CUSOLVERMP_GRID_MAPPING_ROW_MAJOR = 2",
        "CUSOLVERMP_GRID_MAPPING_ROW_MAJOR",
    ),
    (
        "nccl.h",
        r"ncclCommInitRank\(ncclComm_t\* comm, int nranks, ncclUniqueId commId",
        "ncclCommInitRank(ncclComm_t* comm, int nranks, const ncclUniqueId* commId",
        "ncclCommInitRank",
    ),
    ("nccl.h", r"NCCL_UNIQUE_ID_BYTES 128", "NCCL_UNIQUE_ID_BYTES 64", "ncclUniqueId"),
    ("nccl.h", r"ncclSuccess(\s*)=(\s*)0,", "ncclSuccess = 10,", "ncclSuccess"),
    # NCCL's profiling entry points have the same prototypes under a p prefix.
    ("nccl.h", r"\Z", "\n#define ncclCommDestroy pncclCommDestroy\n", "ncclCommDestroy"),
    # Ours: pivots are int64_t, not cuSolverMg's int; NUMROC's coordinates unsigned.
    (
        "vendor/cusolvermp_api.h",
        r"int64_t\*, cudaDataType",
        "int*, cudaDataType",
        "cusolverMpGetrf_bufferSize",
    ),
    (
        "vendor/cusolvermp_api.h",
        r"cusolverMpNUMROC, \(int64_t, int64_t, uint32_t",
        "cusolverMpNUMROC, (int64_t, int64_t, int32_t",
        "cusolverMpNUMROC",
    ),
    (
        "vendor/cusolvermp_api.h",
        r"CUSOLVERMP_GRID_MAPPING_COL_MAJOR = 0",
        "CUSOLVERMP_GRID_MAPPING_COL_MAJOR = 1",
        "CUSOLVERMP_GRID_MAPPING_COL_MAJOR",
    ),
)


def self_test_mutation(compiler: str, folders: list[Path], source: Path, mutation) -> None:
    """A copy of the headers with one change must fail the check, naming what changed.

    (The whole folder of the changed header is copied: NVIDIA's headers include each other
    with quotes, which finds the includer's neighbour before anything on the include path.)
    """
    header, pattern, replacement, name = mutation
    with tempfile.TemporaryDirectory() as tmp:
        csrc = CSRC
        if (CSRC / header).is_file():
            csrc = Path(tmp) / "csrc"
            shutil.copytree(CSRC, csrc)
            path = csrc / header
        else:
            folder = next(f for f in folders for d in include_dirs(f) if (d / header).is_file())
            copy = Path(tmp) / "copy"
            shutil.copytree(folder, copy)
            folders = [copy if f == folder else f for f in folders]
            path = next(p for d in include_dirs(copy) for p in [d / header] if p.is_file())
        changed, count = re.subn(pattern, replacement, path.read_text(), count=1)
        if count != 1:
            raise CheckFailed(f"self-test: /{pattern}/ not found in {header}")
        path.write_text(changed)
        includes = [d for f in folders for d in include_dirs(f)]
        result = compile_check(compiler, includes, csrc / source.relative_to(CSRC), csrc)
    message = result.stdout + result.stderr
    if result.returncode == 0:
        raise CheckFailed(f"self-test: the check passed with {header} changed ({name})")
    if not re.search(rf"static assertion failed: [^\n]*\b{name}\b", message):
        raise CheckFailed(
            f"self-test: the failure with {header} changed does not name {name}:\n{message}"
        )


def self_test_mutations(compiler: str, cuda_folder: Path, mp_folder: Path) -> tuple[int, int]:
    """Every mutation, in parallel; returns how many, and how many of those changed ours."""
    jobs = [([cuda_folder], CHECK_SOURCE, m) for m in MUTATIONS]
    jobs += [([cuda_folder, mp_folder], MP_CHECK_SOURCE, m) for m in MP_MUTATIONS]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for future in [pool.submit(self_test_mutation, compiler, *job) for job in jobs]:
            future.result()
    ours = sum((CSRC / m[0]).is_file() for m in MUTATIONS + MP_MUTATIONS)
    return len(jobs), ours


def self_test_nccl_imports(mp_folders: dict[str, list[Path]]) -> int:
    """An NCCL lacking one function that libcusolverMp.so.0 imports must be refused."""
    cases = 0
    for folders in mp_folders.values():
        for folder in folders:
            with tempfile.TemporaryDirectory() as tmp:
                copy = Path(tmp) / folder.name
                shutil.copytree(folder / "symbols", copy / "symbols")
                imports = (copy / "symbols" / "libcusolverMp.so.0.imports").read_text().split()
                dropped = next(n for n in imports if n.startswith("nccl"))
                table = copy / "symbols" / "libnccl.so.2.txt"
                table.write_text("\n".join(n for n in table.read_text().split() if n != dropped))
                try:
                    check_nccl_imports(folder.name, copy)
                except CheckFailed as error:
                    if dropped not in str(error):
                        raise CheckFailed(f"self-test: {error} does not name {dropped}") from None
                    cases += 1
                    continue
                raise CheckFailed(f"self-test: {folder.name} passes without {dropped}")
    return cases


def self_test_pairing(mp_folders: dict[str, list[Path]]) -> int:
    """A cuSOLVERMp wheel paired with the other CUDA major's headers must be refused."""
    cases = 0
    for label, folders in mp_folders.items():
        for folder in folders:
            for other, releases in MP_RELEASES.items():
                if other == label:
                    continue
                for release in releases:
                    try:
                        check_needs(f"{release.label} in {folder.name}", folder, release.needs)
                    except CheckFailed:
                        cases += 1
                        continue
                    raise CheckFailed(f"self-test: {folder.name} passes as {release.label}")
    return cases


def self_test_cmake(folder: Path, other: Path) -> int:
    """The CMake header gate skips (never fails) on bad header sets, enables on a good one."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise CheckFailed("self-test: cmake not found")
    import pybind11  # noqa: PLC0415 (only the CMake self-test needs it)

    includes = include_dirs(folder)
    by_wheel = {d.parent.name: d for d in includes}  # cuda_runtime, cusolver, cuda_nvcc, ...
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        fake = tmp / "fake"
        fake.mkdir()
        for header in ("cuda.h", "cuda_runtime_api.h", "library_types.h", "cusolverMg.h"):
            (fake / header).write_text("#include <crt/host_defines.h>\n")
        without_crt = [d for d in includes if not (d / "crt").is_dir()]
        # The wheels as CMake's own search finds them: `import nvidia.*` from PYTHONPATH.
        no_nvcc = tmp / "no_nvcc"
        shutil.copytree(folder / "files", no_nvcc, ignore=shutil.ignore_patterns("cuda_nvcc"))
        checking = "jaxmg: checking csrc/vendor/cuda_api.h against the headers of "
        skipping = "jaxmg: csrc/vendor/cuda_api.h is not checked"
        # (what, JAXMG_CUDA_INCLUDE_DIRS or None, PYTHONPATH or None, expected, not expected)
        cases = [
            ("a cusolverMg.h whose includes are missing", [fake], None, skipping, checking),
            ("the wheels without crt/host_defines.h", without_crt, None, skipping, checking),
            ("the wheels", includes, None, checking + "JAXMG_CUDA_INCLUDE_DIRS", skipping),
            # This version's runtime headers, the other version's cuSolverMg and cuBLAS.
            (
                "headers of two CUDA versions",
                [by_wheel["cuda_runtime"], *include_dirs(other)],
                None,
                skipping,
                checking,
            ),
            ("the wheels, imported", None, folder / "files", checking + "CUDA 12 wheels", None),
            # A toolkit may still be found after the wheels are refused.
            (
                "the wheels without nvidia-cuda-nvcc-cu12, imported",
                None,
                no_nvcc,
                "CUDA 12 wheels: [^\n]*crt/host_defines.h",
                checking + "CUDA 12 wheels",
            ),
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
        for i, (what, dirs, pythonpath, expected, unexpected) in enumerate(cases):
            build = tmp / f"build{i}"
            cmd = [cmake, "-S", str(PACKAGE), "-B", str(build)]
            cmd += [f"-DPython_EXECUTABLE={sys.executable}"]
            cmd += [f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"]
            if dirs is not None:
                cmd += ["-DJAXMG_CUDA_INCLUDE_DIRS=" + ";".join(str(d) for d in dirs)]
            case_env = dict(env, PYTHONPATH=str(pythonpath)) if pythonpath else env
            configure = subprocess.run(cmd, capture_output=True, text=True, env=case_env)
            out = configure.stdout + configure.stderr
            if configure.returncode != 0:
                raise CheckFailed(f"self-test: CMake failed with {what}:\n{out}")
            if not re.search(expected, out) or (unexpected and unexpected in out):
                raise CheckFailed(f"self-test: CMake with {what}: expected /{expected}/:\n{out}")
            if checking in out:
                built = subprocess.run(
                    [cmake, "--build", str(build), "--target", "jaxmg_api_check"],
                    capture_output=True,
                    text=True,
                )
                if built.returncode != 0:
                    raise CheckFailed(f"self-test: the CMake check target failed:\n{built.stdout}")
    return len(cases)
