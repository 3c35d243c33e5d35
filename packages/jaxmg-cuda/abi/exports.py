"""What the native module exports: PyInit__jaxmg_cuda, and nothing else.

A module that exports symbols of a libstdc++ it carries (a compiler that links libstdc++
statically) has them mixed by the dynamic loader with the process's own ``libstdc++.so.6``:
on the first GPU machine jaxmg ran on, ``std::ostream << long`` then jumped through the other
copy's vtable and crashed at the first call. CMakeLists.txt links the module with
``--exclude-libs,ALL`` and a version script; this checks the result, reading the ELF dynamic
symbol table directly (no nm or readelf needed).

    python exports.py MODULE.so              # exit 1, listing what else is exported
    python exports.py --static-libstdcxx     # build the module with -static-libstdc++ (CMake
                                             # only, in a temporary folder), then check it

Used by ``tests/native/test_exports.py`` (the installed module) and ``nox -s cuda_abi`` (the
static build: the case that crashed, reproduced with the compiler at hand).
"""

from __future__ import annotations

import argparse
import mmap
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # packages/jaxmg-cuda

ENTRY = "PyInit__jaxmg_cuda"

# The C++ runtime's names, demangled: libstdc++ (std::, __gnu_cxx::), its ABI library
# (__cxxabiv1::, __cxa_*, __gxx_personality_v0) and the unwinder. Without c++filt, mangled
# names whose outermost scope is std (St, or one of the abbreviations Sa Sb Ss Si So Sd) after
# an optional special-name prefix (typeinfo TI, its name TS, vtable TV, VTT TT, guard GV,
# local static Z) and pointer, reference or function types (P, R, F).
_RUNTIME = re.compile(r"std::|__gnu_cxx|__cxxabiv1|^__cxa_|^__gxx_personality|^_Unwind_")
_RUNTIME_MANGLED = re.compile(r"^_Z(?:T[ISVT]|GV|Z)?[PRF]*N?K?S[tabsiod]|__gnu_cxx|__cxxabiv1")


class NotElf(Exception):
    pass


def _elf(path: Path):
    """(data, sections) of a 64-bit little-endian ELF file, for the functions below."""
    f = Path(path).open("rb")
    data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    f.close()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        data.close()
        raise NotElf(f"{path}: not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    return data, sections


def _string(data, table: tuple, offset: int) -> str:
    start = table[4] + offset
    return data[start : data.find(b"\0", start)].decode()


def exported_symbols(path: Path) -> list[str]:
    """Every symbol a 64-bit little-endian ELF shared object exports, sorted: defined (not
    SHN_UNDEF), GLOBAL, WEAK or GNU_UNIQUE binding, default or protected visibility."""
    data, sections = _elf(path)
    with data:
        sht_dynsym = 11
        dynsym = next((s for s in sections if s[1] == sht_dynsym), None)
        if dynsym is None:
            return []
        strtab = sections[dynsym[6]]
        names = set()
        for i in range(1, dynsym[5] // dynsym[9]):
            name_off, info, other, shndx, _value, _size = struct.unpack_from(
                "<IBBHQQ", data, dynsym[4] + i * dynsym[9]
            )
            bind, visibility = info >> 4, other & 0x3
            if shndx == 0 or bind not in (1, 2, 10) or visibility not in (0, 3):
                continue
            names.add(_string(data, strtab, name_off))
    return sorted(names)


def needed_libraries(path: Path) -> list[str]:
    """The DT_NEEDED entries of an ELF shared object: the libraries it links dynamically."""
    data, sections = _elf(path)
    with data:
        sht_dynamic, dt_null, dt_needed = 6, 0, 1
        section = next((s for s in sections if s[1] == sht_dynamic), None)
        needed = []
        for i in range(section[5] // 16 if section is not None else 0):
            tag, value = struct.unpack_from("<qQ", data, section[4] + 16 * i)
            if tag == dt_null:
                break
            if tag == dt_needed:
                needed.append(_string(data, sections[section[6]], value))
    return needed


def demangled(names: list[str]) -> list[str] | None:
    """`names` through c++filt, or None without it."""
    tool = shutil.which("c++filt")
    if tool is None or not names:
        return None if names else []
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    lines = out.stdout.splitlines()
    return lines if out.returncode == 0 and len(lines) == len(names) else None


def runtime_symbols(names: list[str]) -> list[str]:
    """Those of `names` that belong to the C++ runtime (libstdc++, its ABI library), as
    c++filt spells them when it is there."""
    readable = demangled(names)
    if readable is None:
        return [n for n in names if _RUNTIME_MANGLED.search(n) or _RUNTIME.search(n)]
    return [d for d in readable if _RUNTIME.search(d)]


def split_exports(path: Path) -> tuple[list[str], list[str]]:
    """What `path` exports besides PyInit__jaxmg_cuda, and which of those are the C++
    runtime's (demangled where c++filt exists)."""
    extra = [n for n in exported_symbols(path) if n != ENTRY]
    return extra, runtime_symbols(extra)


def report(path: Path, limit: int = 15) -> str:
    """'' when `path` exports PyInit__jaxmg_cuda and nothing else, else what is wrong."""
    names = exported_symbols(path)
    if ENTRY not in names:
        return f"{path} does not export {ENTRY} (it exports {len(names)} symbols)"
    extra, runtime = split_exports(path)
    if not extra:
        return ""
    shown = "\n  ".join((runtime or extra)[:limit])
    return (
        f"{path} exports {len(extra)} symbols besides {ENTRY}, {len(runtime)} of them the C++ "
        f"runtime's (libstdc++ linked statically and exported?), e.g.:\n  {shown}\n"
        "Link the module with -Wl,--exclude-libs,ALL and a version script that keeps only "
        f"{ENTRY} (packages/jaxmg-cuda/CMakeLists.txt)."
    )


def build_static_libstdcxx(source: Path, build: Path) -> Path:
    """Configures and builds the module of `source` (packages/jaxmg-cuda) with CMake alone,
    linked with -static-libstdc++, in `build`; returns the module's path. Compiled without
    optimisation: what is checked is the link (and -O0 leaves more template instantiations to
    export, not fewer)."""
    import pybind11  # noqa: PLC0415 (only the build needs it)

    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("cmake not found")
    cmd = [cmake, "-S", str(source), "-B", str(build)]
    if shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    cmd += [
        f"-DPython_EXECUTABLE={sys.executable}",
        f"-Dpybind11_DIR={pybind11.get_cmake_dir()}",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DCMAKE_CXX_FLAGS_RELEASE=-O0",
        "-DCMAKE_MODULE_LINKER_FLAGS=-static-libstdc++",
        "-DJAXMG_CHECK_CUDA_API=OFF",
    ]
    for step in (cmd, [cmake, "--build", str(build), "--target", "_jaxmg_cuda", "--parallel"]):
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(step)} failed:\n{done.stdout[-4000:]}{done.stderr}")
    found = sorted(build.glob("_jaxmg_cuda*.so"))
    if len(found) != 1:
        raise RuntimeError(f"expected one _jaxmg_cuda*.so in {build}, found {found}")
    return found[0]


def check_static_libstdcxx(source: Path) -> str:
    """Builds `source` with -static-libstdc++ and checks what it exports; raises on failure,
    else returns a summary line."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jaxmg-static-libstdcxx-") as tmp:
        module = build_static_libstdcxx(source, Path(tmp))
        needed = needed_libraries(module)
        if any(n.startswith("libstdc++") for n in needed):
            raise RuntimeError(
                f"-static-libstdc++ did not take: the module still links {needed} (the check "
                "would prove nothing)"
            )
        message = report(module)
        if message:
            raise RuntimeError(message)
        # It loads beside the interpreter's libstdc++.so.6, and formats a message.
        smoke = (
            "import importlib.util, sys\n"
            "spec = importlib.util.spec_from_file_location('_jaxmg_cuda', sys.argv[1])\n"
            "m = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(m)\n"
            "print(m.check_library_sizes(2**40, 8, 4, 0))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", smoke, str(module)], capture_output=True, text=True
        )
        if done.returncode != 0 or "N=1099511627776 does not fit" not in done.stdout:
            raise RuntimeError(
                f"the module built with -static-libstdc++ failed to load or run:\n"
                f"{done.stdout}{done.stderr}"
            )
    return (
        f"a build linked with -static-libstdc++ exports {ENTRY} only, loads and runs "
        f"({time.monotonic() - start:.0f} s)"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module", nargs="?", help="the module to check")
    parser.add_argument(
        "--static-libstdcxx", action="store_true", help="build with -static-libstdc++ and check"
    )
    parser.add_argument("--source", default=str(PACKAGE), help="packages/jaxmg-cuda to build")
    args = parser.parse_args(argv)
    if args.static_libstdcxx == (args.module is not None):
        parser.error("give a module, or --static-libstdcxx")
    try:
        if args.static_libstdcxx:
            print(f"exports: {check_static_libstdcxx(Path(args.source))}", flush=True)
            return 0
        message = report(Path(args.module))
    except RuntimeError as error:
        message = str(error)
    if message:
        print(f"exports: FAILED: {message}", file=sys.stderr, flush=True)
        return 1
    print(f"exports: {args.module} exports {ENTRY} only")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
