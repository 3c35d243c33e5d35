"""Check csrc/cuda_api.h against NVIDIA's real headers and libraries, for CUDA 12 and 13.

No GPU and no CUDA toolkit needed: the headers and the two libraries the loader opens come from
NVIDIA's pip wheels (pinned below), fetched with ``pip download --no-deps`` into a temporary
folder; only the needed members are extracted, the wheels are deleted, and the result is cached
under ``.nox/cuda_abi-cache`` (or ``$JAXMG_CUDA_ABI_CACHE``), one folder per pinned set.

Per CUDA version:

1. ``csrc/cuda_api_check.cc`` compiles (``-fsyntax-only``) against that version's headers only;
   its static_asserts prove every prototype, mirrored type and value of cuda_api.h. Every
   constant and type cuda_api.h declares must be named in the check file.
2. Every name in JAXMG_CUDART_FUNCTIONS / JAXMG_CUSOLVERMG_FUNCTIONS is an exported, defined
   function (default symbol version, what dlsym finds) of libcudart.so.X / libcusolverMg.so.Y,
   read from their ELF dynamic symbol tables. (dlopen would need every library libcusolverMg
   links to: cuBLAS, cuBLASLt, cuSPARSE, nvJitLink, about 1 GB more of wheels.) The driver's
   functions (libcuda.so.1, not in any wheel) are checked against cuda.h only.

Then self-tests of the check itself: a copied header with one prototype or value changed must
fail the compile with a message naming it, and the CMake build's header gate must skip (not
fail) on incomplete or mixed header sets and enable the check on a complete one.

Usage: python cuda_abi.py [--no-self-test]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # packages/jaxmg-cuda
ROOT = PACKAGE.parents[1]
CSRC = PACKAGE / "csrc"
CHECK_SOURCE = CSRC / "cuda_api_check.cc"
API_HEADER = CSRC / "cuda_api.h"
LOADER_SOURCE = CSRC / "cuda_api.cc"
DEFAULT_CACHE = ROOT / ".nox" / "cuda_abi-cache"


@dataclass(frozen=True)
class Release:
    """One CUDA major version: the pinned wheels and the sonames the loader opens."""

    label: str
    wheels: tuple[str, ...]
    libraries: dict[str, str]  # X-macro list ("cudart", "cusolverMg") -> soname


RELEASES = (
    Release(
        "CUDA 12.9",
        (
            "nvidia-cuda-runtime-cu12==12.9.79",  # cuda_runtime_api.h, cuda.h, libcudart.so.12
            "nvidia-cusolver-cu12==11.7.5.82",  # cusolverMg.h, libcusolverMg.so.11
            "nvidia-cublas-cu12==12.9.1.4",  # cublas_api.h (cublasFillMode_t)
            "nvidia-cuda-nvcc-cu12==12.9.86",  # crt/host_defines.h
            "nvidia-cuda-cccl-cu12==12.9.27",  # nv/target
        ),
        {"cudart": "libcudart.so.12", "cusolverMg": "libcusolverMg.so.11"},
    ),
    Release(
        "CUDA 13.0",
        (
            "nvidia-cuda-runtime==13.0.96",
            "nvidia-cusolver==12.0.4.66",
            "nvidia-cublas==13.0.2.14",
            "nvidia-cuda-crt==13.0.88",
            "nvidia-cuda-cccl==13.0.85",
        ),
        {"cudart": "libcudart.so.13", "cusolverMg": "libcusolverMg.so.12"},
    ),
)


def log(message: str) -> None:
    print(f"cuda_abi: {message}", flush=True)


class CheckFailed(Exception):
    pass


# --- Fetching ----------------------------------------------------------------------------------


def wanted_header(member: str) -> bool:
    """Headers directly in a wheel's include/, plus include/crt/ and include/nv/."""
    head, sep, rest = member.partition("/include/")
    if not sep or "/lib/" in head or member.endswith("/"):
        return False
    return "/" not in rest or rest.startswith(("crt/", "nv/"))


def fetch(release: Release, cache_root: Path) -> tuple[Path, dict]:
    """The cached folder for `release` (headers + symbol tables), fetching it if missing."""
    key = hashlib.sha256("\n".join(release.wheels).encode()).hexdigest()[:12]
    folder = cache_root / f"{release.label.replace(' ', '-').lower()}-{key}"
    if (folder / "complete").is_file():
        return folder, {"cached": True}
    cache_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cuda-abi-", dir=cache_root) as tmp:
        tmp = Path(tmp)
        start = time.monotonic()
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir"]
        cmd += ["--only-binary=:all:", "--quiet", "--dest", str(tmp / "wheels"), *release.wheels]
        subprocess.run(cmd, check=True)
        wheels = sorted((tmp / "wheels").glob("*.whl"))
        downloaded = sum(w.stat().st_size for w in wheels)
        seconds = time.monotonic() - start
        staging = tmp / "staging"
        (staging / "symbols").mkdir(parents=True)
        sonames = set(release.libraries.values())
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                for member in archive.namelist():
                    if wanted_header(member):
                        archive.extract(member, staging / "files")
                    elif member.rpartition("/")[2] in sonames and "/lib/" in member:
                        soname = member.rpartition("/")[2]
                        path = Path(archive.extract(member, tmp / "lib"))
                        names = sorted(exported_functions(path))
                        (staging / "symbols" / f"{soname}.txt").write_text("\n".join(names))
                        path.unlink()
            wheel.unlink()
        missing = [s for s in sonames if not (staging / "symbols" / f"{s}.txt").is_file()]
        if missing:
            raise CheckFailed(f"{release.label}: the wheels hold no {', '.join(missing)}")
        (staging / "complete").write_text("\n".join(release.wheels) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    return folder, {"cached": False, "bytes": downloaded, "seconds": seconds}


def include_dirs(folder: Path) -> list[Path]:
    """Every wheel's include/ folder, as laid out in the wheels."""
    return sorted(p for p in (folder / "files").glob("**/include") if p.is_dir())


# --- ELF dynamic symbols -----------------------------------------------------------------------


def exported_functions(path: Path) -> set[str]:
    """Functions a 64-bit little-endian ELF shared object exports to dlsym.

    Defined (not SHN_UNDEF), STT_FUNC or STT_GNU_IFUNC, GLOBAL or WEAK binding, default or
    protected visibility, and (when the library has symbol versions) not a hidden version:
    dlsym without a version finds only the default one.
    """
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise CheckFailed(f"{path.name}: not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    sht_dynsym, sht_gnu_versym = 11, 0x6FFFFFFF
    dynsym = next((s for s in sections if s[1] == sht_dynsym), None)
    if dynsym is None:
        raise CheckFailed(f"{path.name}: no .dynsym section")
    versym = next((s for s in sections if s[1] == sht_gnu_versym), None)
    strtab = sections[dynsym[6]]
    str_off = strtab[4]
    names = set()
    for i in range(dynsym[5] // dynsym[9]):
        name_off, info, other, shndx, _value, _size = struct.unpack_from(
            "<IBBHQQ", data, dynsym[4] + i * dynsym[9]
        )
        kind, bind, visibility = info & 0xF, info >> 4, other & 0x3
        if shndx == 0 or kind not in (2, 10) or bind not in (1, 2) or visibility not in (0, 3):
            continue
        if versym is not None:
            (version,) = struct.unpack_from("<H", data, versym[4] + 2 * i)
            if version & 0x8000:
                continue
        end = data.index(b"\0", str_off + name_off)
        names.add(data[str_off + name_off : end].decode())
    return names


# --- The lists of cuda_api.h -------------------------------------------------------------------


def listed_functions(compiler: str) -> dict[str, list[str]]:
    """The names of each X-macro list, as the loader spells them for dlsym."""
    probe = (
        '#include "cuda_api.h"\n'
        "#define JAXMG_ABI_NAME(lib) JAXMG_ABI_##lib\n"
        "#define JAXMG_ABI_CUDART(ret, name, params) @@jaxmg_abi cudart #name\n"
        "#define JAXMG_ABI_DRIVER(ret, name, params) @@jaxmg_abi driver #name\n"
        "#define JAXMG_ABI_MG(ret, name, params) @@jaxmg_abi cusolverMg #name\n"
        "JAXMG_CUDART_FUNCTIONS(JAXMG_ABI_CUDART)\n"
        "JAXMG_DRIVER_FUNCTIONS(JAXMG_ABI_DRIVER)\n"
        "JAXMG_CUSOLVERMG_FUNCTIONS(JAXMG_ABI_MG)\n"
    )
    out = subprocess.run(
        [compiler, "-std=c++17", "-E", "-P", f"-I{CSRC}", "-x", "c++", "-"],
        input=probe,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lists: dict[str, list[str]] = {"cudart": [], "driver": [], "cusolverMg": []}
    for lib, name in re.findall(r'@@jaxmg_abi (\w+) "(\w+)"', out):
        lists[lib].append(name)
    if not all(lists.values()):
        raise CheckFailed(f"could not read the X-macro lists of cuda_api.h: {lists}")
    return lists


def declared_names() -> tuple[list[str], list[str]]:
    """The constants/enumerators and the enum/struct types cuda_api.h declares."""
    text = re.sub(r"//[^\n]*", "", API_HEADER.read_text())
    constants = re.findall(r"constexpr\s+[\w:\s]+?\s(\w+)\s*=", text)
    types = []
    for name, body in re.findall(r"enum\s+(\w+)\s*\{([^}]*)\}", text):
        types.append(name)
        constants += re.findall(r"(\w+)\s*=", body)
    types += re.findall(r"struct\s+(\w+)\s*\{", text)
    return constants, [t for t in types if t != "Api"]


def check_coverage() -> int:
    """Every constant and type of cuda_api.h is named in the check file."""
    check = CHECK_SOURCE.read_text()
    constants, types = declared_names()
    missing = [n for n in constants if not re.search(rf"\b{n}\b", check)]
    missing += [t for t in types if f"c::{t}" not in check]
    if missing:
        raise CheckFailed(
            "cuda_api.h declares what csrc/cuda_api_check.cc does not check: " + ", ".join(missing)
        )
    return len(constants)


# --- Compiling ---------------------------------------------------------------------------------


def compiler_command(compiler: str, includes: list[Path]) -> list[str]:
    cmd = [compiler, "-std=c++17", "-DDISABLE_CUSOLVERMG_DEPRECATED", f"-I{CSRC}"]
    return cmd + [f"-I{d}" for d in includes]


def clean_env() -> dict[str, str]:
    """No CPATH & co: only the include dirs on the command line are searched."""
    env = dict(os.environ)
    for var in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH"):
        env.pop(var, None)
    return env


def compile_check(compiler: str, includes: list[Path]) -> subprocess.CompletedProcess:
    cmd = compiler_command(compiler, includes) + ["-fsyntax-only", "-Wall", "-Wextra"]
    return subprocess.run(
        cmd + [str(CHECK_SOURCE)], capture_output=True, text=True, env=clean_env()
    )


def headers_used(compiler: str, includes: list[Path]) -> list[Path]:
    """Every header the check compiles with (the compiler's dependency list)."""
    out = subprocess.run(
        compiler_command(compiler, includes) + ["-M", str(CHECK_SOURCE)],
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
    ).stdout
    return [Path(p) for p in out.replace("\\\n", " ").split()[1:]]


def system_dirs(compiler: str) -> list[Path]:
    err = subprocess.run(
        [compiler, "-x", "c++", "-E", "-v", "-"],
        input="",
        capture_output=True,
        text=True,
        env=clean_env(),
    ).stderr
    block = err.split("#include <...> search starts here:")[1].split("End of search list.")[0]
    return [Path(line.strip()).resolve() for line in block.splitlines() if line.strip()]


def check_release(release: Release, folder: Path, compiler: str, lists) -> str:
    includes = include_dirs(folder)
    # (a) Prototypes, types and values, against this version's headers and nothing else.
    sysdirs = system_dirs(compiler)
    if any("cuda" in str(d).lower() for d in sysdirs):
        raise CheckFailed(f"the compiler's own include path has CUDA headers: {sysdirs}")
    allowed = [d.resolve() for d in includes] + [CSRC.resolve()] + sysdirs
    used = headers_used(compiler, includes)
    stray = [p for p in used if not any(p.resolve().is_relative_to(d) for d in allowed)]
    if stray:
        raise CheckFailed(f"{release.label}: headers from outside the wheels: {stray}")
    nvidia = sorted({p.name for p in used if p.resolve().is_relative_to(folder.resolve())})
    for needed in ("cusolverMg.h", "cuda_runtime_api.h", "cuda.h", "library_types.h"):
        if needed not in nvidia:
            raise CheckFailed(f"{release.label}: {needed} was not taken from the wheels")
    result = compile_check(compiler, includes)
    if result.returncode != 0:
        raise CheckFailed(
            f"{release.label}: csrc/cuda_api.h does not match NVIDIA's headers:\n"
            + result.stdout
            + result.stderr
        )
    # (b) Every name the loader asks dlsym for is exported by the library it opens.
    loader = LOADER_SOURCE.read_text()
    symbols = 0
    for lib, soname in release.libraries.items():
        if f'"{soname}"' not in loader:
            raise CheckFailed(f"{release.label}: cuda_api.cc does not open {soname}")
        exported = set((folder / "symbols" / f"{soname}.txt").read_text().split())
        if len(exported) < 20 or "jaxmgNoSuchFunction" in exported:
            raise CheckFailed(f"{soname}: implausible symbol table ({len(exported)} functions)")
        missing = [n for n in lists[lib] if n not in exported]
        if missing:
            raise CheckFailed(f"{release.label}: {soname} does not export {', '.join(missing)}")
        symbols += len(lists[lib])
    functions = sum(len(v) for v in lists.values())
    return (
        f"{release.label}: {functions} prototypes ({len(lists['driver'])} driver, against cuda.h "
        f"only) and the mirrored types and values match {len(nvidia)} NVIDIA headers; "
        f"{symbols} names exported by {' + '.join(release.libraries.values())}"
    )


# --- Self-tests --------------------------------------------------------------------------------

MUTATIONS = (
    # (header, pattern, replacement, what the compile error must name)
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


def self_test_mutations(compiler: str, folder: Path) -> int:
    """A copy of the headers with one change must fail the check, naming what changed.

    (The whole tree is copied: NVIDIA's headers include each other with quotes, which finds
    the includer's neighbour before anything on the include path.)
    """
    for header, pattern, replacement, name in MUTATIONS:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "copy"
            shutil.copytree(folder, copy)
            path = next(p for d in include_dirs(copy) for p in [d / header] if p.is_file())
            changed, count = re.subn(pattern, replacement, path.read_text(), count=1)
            if count != 1:
                raise CheckFailed(f"self-test: /{pattern}/ not found in {header}")
            path.write_text(changed)
            result = compile_check(compiler, include_dirs(copy))
        message = result.stdout + result.stderr
        if result.returncode == 0:
            raise CheckFailed(f"self-test: the check passed with {header} changed ({name})")
        if not re.search(rf"static assertion failed: [^\n]*\b{name}\b", message):
            raise CheckFailed(
                f"self-test: the failure with {header} changed does not name {name}:\n{message}"
            )
    return len(MUTATIONS)


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
        checking = "jaxmg: checking csrc/cuda_api.h against the headers of "
        skipping = "jaxmg: csrc/cuda_api.h is not checked"
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


# --- Main --------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-self-test", action="store_true", help="skip the self-tests")
    args = parser.parse_args()
    cache_root = Path(os.environ.get("JAXMG_CUDA_ABI_CACHE", DEFAULT_CACHE))
    compiler = os.environ.get("CXX") or shutil.which("c++") or "g++"
    start = time.monotonic()
    summary = []
    try:
        constants = check_coverage()
        lists = listed_functions(compiler)
        folders = {}
        for release in RELEASES:
            folder, fetched = fetch(release, cache_root)
            folders[release.label] = folder
            if fetched["cached"]:
                log(f"{release.label}: cached in {folder}")
            else:
                mib = fetched["bytes"] / 2**20
                log(f"{release.label}: downloaded {mib:.0f} MiB in {fetched['seconds']:.1f} s")
            summary.append(check_release(release, folder, compiler, lists))
        summary.append(f"{constants} constants of cuda_api.h, each asserted in cuda_api_check.cc")
        if not args.no_self_test:
            newest = folders[RELEASES[-1].label]
            oldest = folders[RELEASES[0].label]
            mutated = self_test_mutations(compiler, newest)
            cases = self_test_cmake(oldest, newest)
            summary.append(
                f"self-tests: {mutated} mutated headers each fail the check naming the culprit; "
                f"{cases} CMake header sets gated as expected"
            )
    except (CheckFailed, subprocess.CalledProcessError) as error:
        print(f"\ncuda_abi: FAILED: {error}", file=sys.stderr, flush=True)
        return 1
    for line in summary:
        log(line)
    log(f"passed in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
