"""Check csrc/vendor/cuda_api.h against NVIDIA's real headers and libraries, for CUDA 12 and 13.

No GPU and no CUDA toolkit needed: the headers and the two libraries the loader opens come from
NVIDIA's pip wheels (pinned below), fetched with ``pip download --no-deps`` into a temporary
folder; only the needed members are extracted, the wheels are deleted, and the result is cached
under ``.nox/cuda_abi-cache`` (or ``$JAXMG_CUDA_ABI_CACHE``), one folder per pinned set.

Per CUDA version:

1. ``csrc/vendor/check/cuda_api_check.cc`` compiles (``-fsyntax-only``) against that
   version's headers only; its static_asserts prove every prototype, mirrored type and value
   of cuda_api.h. Every constant and type cuda_api.h declares must be named in the check file.
2. Every name in JAXMG_CUDART_FUNCTIONS / JAXMG_CUSOLVERMG_FUNCTIONS is an exported, defined
   function (default symbol version, what dlsym finds) of libcudart.so.X / libcusolverMg.so.Y,
   read from their ELF dynamic symbol tables. (dlopen would need every library libcusolverMg
   links to: cuBLAS, cuBLASLt, cuSPARSE, nvJitLink, about 1 GB more of wheels.) The driver's
   functions (libcuda.so.1, not in any wheel) are checked against cuda.h only.

3. The same for ``csrc/vendor/cusolvermp_api.h`` (cuSOLVERMp and NCCL, backend "mp" on GPUs),
   with ``csrc/vendor/check/cusolvermp_api_check.cc``, for each cuSOLVERMp release the engine
   binds (0.8.0 with NCCL 2.28, what GPU images ship, and 0.9.1 with the NCCL it needs; pinned
   in MP_RELEASES, cached the same way): compiled against its wheels plus that CUDA version's
   headers above; every name of JAXMG_CUSOLVERMP_FUNCTIONS / JAXMG_NCCL_FUNCTIONS is exported
   by libcusolverMp.so.0 / libnccl.so.2, whose sonames are the ones the header names; the
   names of JAXMG_CUSOLVERMP_GESVD_FUNCTIONS are exported exactly by the releases from
   kCusolverMpGesvdSince on; every NCCL function libcusolverMp.so.0 imports is exported by the
   NCCL it is pinned with; and libcusolverMp.so.0 links that CUDA major's runtime and cuSOLVER
   (the pairing is right).

Both declaration headers must compile on their own with the C++ standard library alone (and
csrc/ on the include path, where they find each other).

Then self-tests of the check itself: a copied header (NVIDIA's, or ours) with one prototype or
value changed must fail the compile with a message naming it, a cuSOLVERMp wheel paired with
the other CUDA major must be refused, so must an NCCL lacking one function cuSOLVERMp imports,
and the CMake build's header gate must skip (not fail) on incomplete or mixed header sets and
enable the check on a complete one.

Usage: python cuda_abi.py [--no-self-test]
"""

from __future__ import annotations

import argparse
import hashlib
import mmap
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # packages/jaxmg-cuda
ROOT = PACKAGE.parents[1]
CSRC = PACKAGE / "csrc"
# Paths relative to CSRC are what the sources #include (csrc/ is on the include path).
CHECK_SOURCE = CSRC / "vendor" / "check" / "cuda_api_check.cc"
API_HEADER = CSRC / "vendor" / "cuda_api.h"
LOADER_SOURCE = CSRC / "vendor" / "cuda_api.cc"
MP_CHECK_SOURCE = CSRC / "vendor" / "check" / "cusolvermp_api_check.cc"
MP_HEADER = CSRC / "vendor" / "cusolvermp_api.h"
DEFAULT_CACHE = ROOT / ".nox" / "cuda_abi-cache"


@dataclass(frozen=True)
class Release:
    """One CUDA major version: the pinned wheels and the sonames the loader opens."""

    label: str
    wheels: tuple[str, ...]
    libraries: dict[str, str]  # X-macro list ("cudart", "cusolverMg") -> soname
    # soname -> sonames it must link (DT_NEEDED): what ties a wheel to one CUDA major
    needs: dict[str, tuple[str, ...]] = field(default_factory=dict)


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


# cuSOLVERMp and NCCL for each CUDA release above (by label), one pair per cuSOLVERMp release
# the engine binds: their headers are compiled with that CUDA release's (cusolverMp.h includes
# cusolverDn.h). cusolverMp.h and nccl.h are the same files in the -cu12 and -cu13 wheels; the
# libraries are built for one CUDA major each. 0.8.0 goes with NCCL 2.28.9, the NCCL of the lent
# GPU machines' image (0.9.x needs cuBLASMp, which needs NCCL >= 2.29.2).
MP_LIBRARIES = {"cusolverMp": "libcusolverMp.so.0", "nccl": "libnccl.so.2"}


def _mp_release(cusolvermp: str, nccl: str, major: int, cusolver: int) -> Release:
    short = cusolvermp.split(".")[:3]
    return Release(
        f"cuSOLVERMp {'.'.join(short)} + NCCL {nccl} for CUDA {major}",
        (
            f"nvidia-cusolvermp-cu{major}=={cusolvermp}",  # cusolverMp.h, libcusolverMp.so.0
            f"nvidia-nccl-cu{major}=={nccl}",  # nccl.h, libnccl.so.2
        ),
        MP_LIBRARIES,
        {
            "libcusolverMp.so.0": (
                "libnccl.so.2",
                f"libcudart.so.{major}",
                f"libcusolver.so.{cusolver}",
            )
        },
    )


MP_RELEASES = {
    "CUDA 12.9": (
        _mp_release("0.8.0.3126", "2.28.9", 12, 11),
        _mp_release("0.9.1.9318.post1", "2.32.3", 12, 11),
    ),
    "CUDA 13.0": (
        _mp_release("0.8.0.3126", "2.28.9", 13, 12),
        _mp_release("0.9.1.9318.post1", "2.32.3", 13, 12),
    ),
}


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
    key = hashlib.sha256("\n".join((CACHE_FORMAT, *release.wheels)).encode()).hexdigest()[:12]
    folder = cache_root / f"{re.sub(r'[^a-z0-9.]+', '-', release.label.lower())}-{key}"
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
                        names, dynamic, imports = read_elf(path)
                        (staging / "symbols" / f"{soname}.txt").write_text("\n".join(names))
                        (staging / "symbols" / f"{soname}.dynamic").write_text("\n".join(dynamic))
                        (staging / "symbols" / f"{soname}.imports").write_text("\n".join(imports))
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


def read_elf(path: Path) -> tuple[list[str], list[str], list[str]]:
    """The functions a 64-bit little-endian ELF shared object exports to dlsym, sorted, its
    dynamic section's ``SONAME x`` and ``NEEDED y`` entries, and the names it imports (undefined
    symbols, sorted).

    Exported: defined (not SHN_UNDEF), STT_FUNC or STT_GNU_IFUNC, GLOBAL or WEAK binding,
    default or protected visibility, and (when the library has symbol versions) not a hidden
    version: dlsym without a version finds only the default one.
    """
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise CheckFailed(f"{path.name}: not a 64-bit little-endian ELF file")
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        sections = [
            struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
        ]

        def string(table: tuple, offset: int) -> str:
            start = table[4] + offset
            return data[start : data.find(b"\0", start)].decode()

        sht_dynamic, sht_dynsym, sht_gnu_versym = 6, 11, 0x6FFFFFFF
        dynsym = next((s for s in sections if s[1] == sht_dynsym), None)
        if dynsym is None:
            raise CheckFailed(f"{path.name}: no .dynsym section")
        versym = next((s for s in sections if s[1] == sht_gnu_versym), None)
        strtab = sections[dynsym[6]]
        names, imports = set(), set()
        for i in range(dynsym[5] // dynsym[9]):
            name_off, info, other, shndx, _value, _size = struct.unpack_from(
                "<IBBHQQ", data, dynsym[4] + i * dynsym[9]
            )
            kind, bind, visibility = info & 0xF, info >> 4, other & 0x3
            if shndx == 0 and name_off != 0:
                imports.add(string(strtab, name_off))
            if shndx == 0 or kind not in (2, 10) or bind not in (1, 2) or visibility not in (0, 3):
                continue
            if versym is not None:
                (version,) = struct.unpack_from("<H", data, versym[4] + 2 * i)
                if version & 0x8000:
                    continue
            names.add(string(strtab, name_off))
        dynamic = []
        section = next((s for s in sections if s[1] == sht_dynamic), None)
        if section is not None:
            dt_null, dt_needed, dt_soname = 0, 1, 14
            for i in range(section[5] // 16):
                tag, value = struct.unpack_from("<qQ", data, section[4] + 16 * i)
                if tag == dt_null:
                    break
                if tag in (dt_needed, dt_soname):
                    entry = "NEEDED" if tag == dt_needed else "SONAME"
                    dynamic.append(f"{entry} {string(sections[section[6]], value)}")
    return sorted(names), dynamic, sorted(imports)


# --- The lists and declarations of our headers ------------------------------------------------

# X-macro list (the key used everywhere here) -> the macro, per declaration header.
CUDA_LISTS = {
    "cudart": "JAXMG_CUDART_FUNCTIONS",
    "driver": "JAXMG_DRIVER_FUNCTIONS",
    "cusolverMg": "JAXMG_CUSOLVERMG_FUNCTIONS",
}
MP_LISTS = {"nccl": "JAXMG_NCCL_FUNCTIONS", "cusolverMp": "JAXMG_CUSOLVERMP_FUNCTIONS"}
# The functions of releases from kCusolverMpGesvdSince on, in libcusolverMp.so.0.
MP_GESVD_LIST = {"cusolverMp": "JAXMG_CUSOLVERMP_GESVD_FUNCTIONS"}
# What the fetched folders hold (bumped when fetch() records more), part of each cache key.
CACHE_FORMAT = "symbols, dynamic section, imports"


def header_version(folder: Path) -> int:
    """CUSOLVERMP_VERSION of the cusolverMp.h in `folder` (major * 1000 + minor * 100 +
    patch)."""
    header = next(p for d in include_dirs(folder) for p in [d / "cusolverMp.h"] if p.is_file())
    parts = dict(
        re.findall(r"#define CUSOLVERMP_VER_(MAJOR|MINOR|PATCH)\s+(\d+)", header.read_text())
    )
    return int(parts["MAJOR"]) * 1000 + int(parts["MINOR"]) * 100 + int(parts["PATCH"])


def header_constant(name: str) -> int:
    """An ``inline constexpr int`` of cusolvermp_api.h."""
    found = re.search(rf"constexpr int {name} = (\d+);", MP_HEADER.read_text())
    if found is None:
        raise CheckFailed(f"cusolvermp_api.h declares no constexpr int {name}")
    return int(found.group(1))


def listed_functions(compiler: str, header: Path, macros: dict[str, str]) -> dict[str, list[str]]:
    """The names of each X-macro list of `header`, as a loader spells them for dlsym."""
    probe = f'#include "{header.relative_to(CSRC).as_posix()}"\n'
    for lib, macro in macros.items():
        probe += f"#define JAXMG_PROBE_{lib}(ret, name, params) @@jaxmg_abi {lib} #name\n"
        probe += f"{macro}(JAXMG_PROBE_{lib})\n"
    out = subprocess.run(
        [compiler, "-std=c++17", "-E", "-P", f"-I{CSRC}", "-x", "c++", "-"],
        input=probe,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lists: dict[str, list[str]] = {lib: [] for lib in macros}
    for lib, name in re.findall(r'@@jaxmg_abi (\w+) "(\w+)"', out):
        lists[lib].append(name)
    if not all(lists.values()):
        raise CheckFailed(f"could not read the X-macro lists of {header.name}: {lists}")
    return lists


def declared_names(header: Path) -> tuple[list[str], list[str], list[str]]:
    """The constants/enumerators, the enum/struct types and the type aliases (``using x =``,
    ``typedef struct s* x``) that `header` declares."""
    text = re.sub(r"//[^\n]*", "", header.read_text())
    constants = re.findall(r"constexpr\s+[\w:\s]+?\s(\w+)\s*=", text)
    types = []
    for name, body in re.findall(r"enum\s+(\w+)\s*\{([^}]*)\}", text):
        types.append(name)
        constants += re.findall(r"(\w+)\s*=", body)
    types += re.findall(r"struct\s+(\w+)\s*\{", text)
    aliases = re.findall(r"using\s+(\w+)\s*=", text)
    aliases += re.findall(r"typedef\s+struct\s+\w+\s*\*\s*(\w+)\s*;", text)
    return constants, [t for t in types if t not in ("Api", "MpApi")], aliases


def check_coverage(header: Path, check_source: Path) -> int:
    """Every constant, type and alias of `header` is named in its check file."""
    check = check_source.read_text()
    constants, types, aliases = declared_names(header)
    missing = [n for n in constants + aliases if not re.search(rf"\b{n}\b", check)]
    missing += [t for t in types if f"c::{t}" not in check]
    if missing:
        raise CheckFailed(
            f"{header.name} declares what {check_source.relative_to(PACKAGE)} does not check: "
            + ", ".join(missing)
        )
    return len(constants)


# --- Compiling ---------------------------------------------------------------------------------


def compiler_command(compiler: str, includes: list[Path], csrc: Path = CSRC) -> list[str]:
    cmd = [compiler, "-std=c++17", "-DDISABLE_CUSOLVERMG_DEPRECATED", f"-I{csrc}"]
    return cmd + [f"-I{d}" for d in includes]


def clean_env() -> dict[str, str]:
    """No CPATH & co: only the include dirs on the command line are searched."""
    env = dict(os.environ)
    for var in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH"):
        env.pop(var, None)
    return env


def compile_check(
    compiler: str, includes: list[Path], source: Path = CHECK_SOURCE, csrc: Path = CSRC
) -> subprocess.CompletedProcess:
    cmd = compiler_command(compiler, includes, csrc) + ["-fsyntax-only", "-Wall", "-Wextra"]
    return subprocess.run(cmd + [str(source)], capture_output=True, text=True, env=clean_env())


def headers_used(compiler: str, includes: list[Path], source: Path = CHECK_SOURCE) -> list[Path]:
    """Every header `source` compiles with (the compiler's dependency list)."""
    out = subprocess.run(
        compiler_command(compiler, includes) + ["-M", str(source)],
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


def check_compiles(
    label: str, compiler: str, header: Path, source: Path, folders: dict[Path, tuple[str, ...]]
) -> int:
    """`source` compiles against the headers of `folders` (and the compiler's own) only, taking
    from each folder the headers listed for it. Returns how many NVIDIA headers it used."""
    includes = [d for folder in folders for d in include_dirs(folder)]
    sysdirs = system_dirs(compiler)
    if any("cuda" in str(d).lower() for d in sysdirs):
        raise CheckFailed(f"the compiler's own include path has CUDA headers: {sysdirs}")
    allowed = [d.resolve() for d in includes] + [CSRC.resolve()] + sysdirs
    used = headers_used(compiler, includes, source)
    stray = [p for p in used if not any(p.resolve().is_relative_to(d) for d in allowed)]
    if stray:
        raise CheckFailed(f"{label}: headers from outside the wheels: {stray}")
    nvidia = set()
    for folder, needed in folders.items():
        taken = {p.name for p in used if p.resolve().is_relative_to(folder.resolve())}
        for name in needed:
            if name not in taken:
                raise CheckFailed(f"{label}: {name} was not taken from the wheels")
        nvidia |= {(folder, name) for name in taken}
    result = compile_check(compiler, includes, source)
    if result.returncode != 0:
        raise CheckFailed(
            f"{label}: {header.relative_to(PACKAGE)} does not match NVIDIA's headers:\n"
            + result.stdout
            + result.stderr
        )
    return len(nvidia)


def check_exports(label: str, folder: Path, libraries: dict[str, str], lists) -> int:
    """Every name of each list is an exported function of its library; returns how many."""
    symbols = 0
    for lib, soname in libraries.items():
        exported = set((folder / "symbols" / f"{soname}.txt").read_text().split())
        if len(exported) < 20 or "jaxmgNoSuchFunction" in exported:
            raise CheckFailed(f"{soname}: implausible symbol table ({len(exported)} functions)")
        missing = [n for n in lists[lib] if n not in exported]
        if missing:
            raise CheckFailed(f"{label}: {soname} does not export {', '.join(missing)}")
        symbols += len(lists[lib])
    return symbols


def check_nccl_imports(label: str, folder: Path) -> list[str]:
    """Every NCCL function libcusolverMp.so.0 imports is exported by the NCCL of `folder` (a
    cuSOLVERMp that needs a newer NCCL fails to load with an undefined symbol); returns them."""
    imports = (folder / "symbols" / f"{MP_LIBRARIES['cusolverMp']}.imports").read_text().split()
    nccl = set((folder / "symbols" / f"{MP_LIBRARIES['nccl']}.txt").read_text().split())
    wanted = [name for name in imports if name.startswith(("nccl", "pnccl"))]
    unresolved = [name for name in wanted if name not in nccl]
    if not wanted:
        raise CheckFailed(f"{label}: libcusolverMp.so.0 imports no NCCL function: implausible")
    if unresolved:
        raise CheckFailed(f"{label}: libnccl.so.2 does not export {', '.join(unresolved)}")
    return wanted


def check_needs(label: str, folder: Path, needs: dict[str, tuple[str, ...]]) -> None:
    """Each library of `folder` has its file name as soname and links what `needs` says."""
    for soname, needed in needs.items():
        path = folder / "symbols" / f"{soname}.dynamic"
        if not path.is_file():
            raise CheckFailed(f"{label}: no dynamic section recorded in {folder}; delete it")
        dynamic = path.read_text().splitlines()
        if f"SONAME {soname}" not in dynamic:
            raise CheckFailed(f"{label}: the soname of {soname} is not {soname}: {dynamic}")
        missing = [n for n in needed if f"NEEDED {n}" not in dynamic]
        if missing:
            raise CheckFailed(f"{label}: {soname} does not link {', '.join(missing)}: {dynamic}")


def check_standalone(compiler: str, headers: tuple[Path, ...]) -> None:
    """Each header compiles alone, with nothing but csrc/ (on the include path) and the C++
    standard library."""
    sysdirs = system_dirs(compiler) + [CSRC.resolve()]
    for header in headers:
        base = [compiler, "-std=c++17", f"-I{CSRC}", "-x", "c++", str(header)]
        result = subprocess.run(
            base + ["-fsyntax-only", "-Wall", "-Wextra", "-Werror"],
            capture_output=True,
            text=True,
            env=clean_env(),
        )
        if result.returncode != 0:
            raise CheckFailed(f"{header.name} does not compile on its own:\n{result.stderr}")
        deps = subprocess.run(
            base + ["-M"], capture_output=True, text=True, check=True, env=clean_env()
        ).stdout
        used = [Path(p) for p in deps.replace("\\\n", " ").split()[1:]]
        stray = [p for p in used if not any(p.resolve().is_relative_to(d) for d in sysdirs)]
        if stray:
            raise CheckFailed(f"{header.name} includes more than the standard library: {stray}")


def check_release(release: Release, folder: Path, compiler: str, lists) -> str:
    # (a) Prototypes, types and values, against this version's headers and nothing else.
    needed = ("cusolverMg.h", "cuda_runtime_api.h", "cuda.h", "library_types.h")
    nvidia = check_compiles(release.label, compiler, API_HEADER, CHECK_SOURCE, {folder: needed})
    # (b) Every name the loader asks dlsym for is exported by the library it opens.
    loader = LOADER_SOURCE.read_text()
    for soname in release.libraries.values():
        if f'"{soname}"' not in loader:
            raise CheckFailed(f"{release.label}: cuda_api.cc does not open {soname}")
    symbols = check_exports(release.label, folder, release.libraries, lists)
    functions = sum(len(v) for v in lists.values())
    return (
        f"{release.label}: {functions} prototypes ({len(lists['driver'])} driver, against cuda.h "
        f"only) and the mirrored types and values match {nvidia} NVIDIA headers; "
        f"{symbols} names exported by {' + '.join(release.libraries.values())}"
    )


def check_mp_release(
    mp: Release, folder: Path, cuda: Release, cuda_folder: Path, compiler: str, lists, gesvd
) -> str:
    label = f"{mp.label} (with {cuda.label}'s headers)"
    # (a) Prototypes, types and values: cusolverMp.h and nccl.h from the cuSOLVERMp and NCCL
    # wheels, what they include from this CUDA version's wheels.
    nvidia = check_compiles(
        label,
        compiler,
        MP_HEADER,
        MP_CHECK_SOURCE,
        {cuda_folder: ("cusolverDn.h", "library_types.h"), folder: ("cusolverMp.h", "nccl.h")},
    )
    # (b) The libraries: the sonames cusolvermp_api.h gives, built for this CUDA major, and
    # exporting every name of the lists.
    header = MP_HEADER.read_text()
    for soname in mp.libraries.values():
        if f'"{soname}"' not in header:
            raise CheckFailed(f"{label}: cusolvermp_api.h does not name {soname}")
    check_needs(label, folder, mp.needs)
    symbols = check_exports(label, folder, mp.libraries, lists)
    # (c) The functions of later releases: exported exactly from kCusolverMpGesvdSince on.
    version, since = header_version(folder), header_constant("kCusolverMpGesvdSince")
    if version < header_constant("kCusolverMpOldest"):
        raise CheckFailed(f"{label}: cuSOLVERMp {version} is older than kCusolverMpOldest")
    exported = set((folder / "symbols" / f"{MP_LIBRARIES['cusolverMp']}.txt").read_text().split())
    present = [name for name in gesvd["cusolverMp"] if name in exported]
    expected = gesvd["cusolverMp"] if version >= since else []
    if present != expected:
        raise CheckFailed(
            f"{label}: version {version}, kCusolverMpGesvdSince {since}, but the library exports "
            f"{present or 'none'} of JAXMG_CUSOLVERMP_GESVD_FUNCTIONS"
        )
    wanted = check_nccl_imports(label, folder)
    counts = ", ".join(f"{len(names)} {lib}" for lib, names in lists.items())
    links = ", ".join(n for needs in mp.needs.values() for n in needs)
    optional = f"{len(present)} of {len(gesvd['cusolverMp'])} GESVD functions"
    return (
        f"{label}: {sum(len(v) for v in lists.values())} prototypes ({counts}) and the "
        f"mirrored types and values match {nvidia} NVIDIA headers; {symbols} names exported by "
        f"{' + '.join(mp.libraries.values())}, {optional} (version {version}); the "
        f"{len(wanted)} NCCL functions libcusolverMp.so.0 imports resolved; libcusolverMp.so.0 "
        f"links {links}"
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


# --- Main --------------------------------------------------------------------------------------


def fetch_logged(release: Release, cache_root: Path) -> Path:
    folder, fetched = fetch(release, cache_root)
    if fetched["cached"]:
        log(f"{release.label}: cached in {folder}")
    else:
        mib = fetched["bytes"] / 2**20
        log(f"{release.label}: downloaded {mib:.0f} MiB in {fetched['seconds']:.1f} s")
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-self-test", action="store_true", help="skip the self-tests")
    args = parser.parse_args()
    cache_root = Path(os.environ.get("JAXMG_CUDA_ABI_CACHE", DEFAULT_CACHE))
    compiler = os.environ.get("CXX") or shutil.which("c++") or "g++"
    start = time.monotonic()
    summary = []
    try:
        constants = check_coverage(API_HEADER, CHECK_SOURCE)
        mp_constants = check_coverage(MP_HEADER, MP_CHECK_SOURCE)
        check_standalone(compiler, (API_HEADER, MP_HEADER))
        lists = listed_functions(compiler, API_HEADER, CUDA_LISTS)
        mp_lists = listed_functions(compiler, MP_HEADER, MP_LISTS)
        gesvd = listed_functions(compiler, MP_HEADER, MP_GESVD_LIST)
        unpaired = [r.label for r in RELEASES if r.label not in MP_RELEASES]
        if unpaired:
            raise CheckFailed(f"no cuSOLVERMp wheels pinned for {', '.join(unpaired)}")
        folders, mp_folders = {}, {}
        for release in RELEASES:
            folders[release.label] = fetch_logged(release, cache_root)
            summary.append(check_release(release, folders[release.label], compiler, lists))
        for release in RELEASES:
            mp_folders[release.label] = []
            for mp in MP_RELEASES[release.label]:
                mp_folder = fetch_logged(mp, cache_root)
                mp_folders[release.label].append(mp_folder)
                summary.append(
                    check_mp_release(
                        mp, mp_folder, release, folders[release.label], compiler, mp_lists, gesvd
                    )
                )
        summary.append(f"{constants} constants of cuda_api.h, each asserted in cuda_api_check.cc")
        summary.append(
            f"{mp_constants} constants of cusolvermp_api.h, each asserted in "
            "cusolvermp_api_check.cc"
        )
        summary.append(
            "cuda_api.h and cusolvermp_api.h compile alone (csrc/ and the C++ standard library)"
        )
        if not args.no_self_test:
            newest = RELEASES[-1].label
            oldest = folders[RELEASES[0].label]
            mutated, ours = self_test_mutations(compiler, folders[newest], mp_folders[newest][-1])
            paired = self_test_pairing(mp_folders)
            dropped = self_test_nccl_imports(mp_folders)
            cases = self_test_cmake(oldest, folders[newest])
            summary.append(
                f"self-tests: {mutated} mutated headers ({ours} of them ours) each fail the check "
                f"naming the culprit; {paired} cuSOLVERMp wheels refused with the other CUDA "
                f"major; {dropped} NCCLs lacking one imported function refused; {cases} CMake "
                "header sets gated as expected"
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
