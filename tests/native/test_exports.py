"""The native module exports PyInit__jaxmg_cuda and nothing else.

A module that exports the libstdc++ it carries (a compiler that links libstdc++ statically)
crashed at the first call on a GPU machine: the loader mixed its copy with the process's
``libstdc++.so.6``. ``nox -s cuda_abi`` checks a build with ``-static-libstdc++``; this checks
the module installed here, whatever compiler built it. The symbol table is read by
``packages/jaxmg-cuda/abi/exports.py`` (pure Python, no nm needed).
"""

import importlib.util
import platform
import sys
from pathlib import Path

import pytest

from jaxmg_cuda import _jaxmg_cuda

ROOT = Path(__file__).resolve().parents[2]


def _exports():
    spec = importlib.util.spec_from_file_location(
        "jaxmg_cuda_exports", ROOT / "packages" / "jaxmg-cuda" / "abi" / "exports.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


exports = _exports()


@pytest.fixture
def module_path(once_per_suite):
    if platform.system() != "Linux":
        pytest.skip("the module is linked with a version script on Linux only")
    return Path(_jaxmg_cuda.__file__)


def test_module_exports_only_its_entry_point(module_path):
    assert exports.report(module_path) == ""
    assert exports.exported_symbols(module_path) == ["PyInit__jaxmg_cuda"]


def test_the_check_sees_libstdcxx_exports(once_per_suite):
    """The check itself, on a library that does export the C++ runtime: the process's own
    libstdc++.so.6."""
    found = [
        Path(line.split()[-1])
        for line in Path("/proc/self/maps").read_text().splitlines()
        if "libstdc++.so" in line.split()[-1]
    ]
    if not found:
        pytest.skip("no libstdc++.so mapped in this process")
    extra, runtime = exports.split_exports(found[0])
    assert 1000 < len(runtime) <= len(extra), (len(extra), len(runtime))
    assert any("std::" in name or name.startswith("_ZNSt") for name in runtime)
