"""The checks of ``cuda_abi.py`` (``nox -s cuda_abi``): the lists and declarations of our
headers, compiling the check sources against NVIDIA's headers alone, and what the libraries of
the wheels export, import and link."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from nvidia_wheels import (
    MP_LIBRARIES,
    PACKAGE,
    CheckFailed,
    Release,
    include_dirs,
)

CSRC = PACKAGE / "csrc"
# Paths relative to CSRC are what the sources #include (csrc/ is on the include path).
CHECK_SOURCE = CSRC / "vendor" / "check" / "cuda_api_check.cc"
API_HEADER = CSRC / "vendor" / "cuda_api.h"
LOADER_SOURCE = CSRC / "vendor" / "cuda_api.cc"
MP_CHECK_SOURCE = CSRC / "vendor" / "check" / "cusolvermp_api_check.cc"
MP_HEADER = CSRC / "vendor" / "cusolvermp_api.h"


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
