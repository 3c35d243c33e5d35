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

The pieces, beside this file: ``nvidia_wheels.py`` (the pinned releases, fetching and caching
them, reading ELF symbol tables), ``declaration_checks.py`` (the checks of steps 1 to 3) and
``self_tests.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from declaration_checks import (
    API_HEADER,
    CHECK_SOURCE,
    CUDA_LISTS,
    MP_CHECK_SOURCE,
    MP_GESVD_LIST,
    MP_HEADER,
    MP_LISTS,
    check_coverage,
    check_mp_release,
    check_release,
    check_standalone,
    listed_functions,
)
from nvidia_wheels import (
    DEFAULT_CACHE,
    MP_RELEASES,
    RELEASES,
    CheckFailed,
    Release,
    fetch,
    log,
)
from self_tests import (
    self_test_cmake,
    self_test_mutations,
    self_test_nccl_imports,
    self_test_pairing,
)

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
