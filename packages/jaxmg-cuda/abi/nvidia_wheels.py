"""NVIDIA's pinned wheels for ``cuda_abi.py`` (``nox -s cuda_abi``): the releases checked, and
fetching them once into a cache of their headers and the symbol tables of their libraries (read
from the ELF files, no loader involved)."""

from __future__ import annotations

import hashlib
import mmap
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # packages/jaxmg-cuda
ROOT = PACKAGE.parents[1]
DEFAULT_CACHE = ROOT / ".nox" / "cuda_abi-cache"
# What the fetched folders hold (bumped when fetch() records more), part of each cache key.
CACHE_FORMAT = "symbols, dynamic section, imports"


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
