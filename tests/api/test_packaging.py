"""The three packages can be released: each version is written once (its pyproject.toml, read at
run time through the package metadata), they depend on each other by version (PyPI refuses
direct references), and they agree on the versions of Python they take."""

import importlib.metadata
import pathlib
import re
import tomllib

import pytest

pytestmark = pytest.mark.usefixtures("once_per_suite")

PACKAGES = pathlib.Path(__file__).parents[2] / "packages"
NAMES = ("jaxmg-layout", "jaxmg-cuda", "jaxmg")


def project(name):
    return tomllib.loads((PACKAGES / name / "pyproject.toml").read_text())["project"]


def test_one_version_released_together():
    versions = {name: project(name)["version"] for name in NAMES}
    assert len(set(versions.values())) == 1, versions
    major_minor = ".".join(versions["jaxmg"].split(".")[:2])
    pins = [d for d in project("jaxmg")["dependencies"] if d.startswith("jaxmg-")]
    assert sorted(pins) == [f"jaxmg-cuda == {major_minor}.*", f"jaxmg-layout == {major_minor}.*"]
    for name in NAMES:  # what is installed is what the pyproject says
        assert importlib.metadata.version(name) == versions[name]


def test_no_version_written_in_the_sources():
    for path in PACKAGES.glob("*/src/**/*.py"):
        assert not re.search(r"__version__\s*=\s*['\"]", path.read_text()), path


def test_no_direct_references_and_one_python():
    for name in NAMES:
        for requirement in project(name)["dependencies"]:
            assert "@" not in requirement, (name, requirement)
        assert project(name)["requires-python"] == ">=3.11"
    cmake = (PACKAGES / "jaxmg-cuda" / "CMakeLists.txt").read_text()
    assert "find_package(Python 3.11 " in cmake


def test_every_public_function_is_typed():
    """Every function ``jaxmg`` exports states the types of its arguments and of its result
    (and they resolve: ``typing.get_type_hints``)."""
    import inspect
    import typing

    import jaxmg

    missing = {}
    for name in dir(jaxmg):
        fn = getattr(jaxmg, name)
        if name.startswith("_") or not inspect.isfunction(fn):
            continue
        hints = typing.get_type_hints(fn)
        untyped = [p for p in inspect.signature(fn).parameters if p not in hints]
        if untyped or "return" not in hints:
            missing[name] = untyped + ([] if "return" in hints else ["return"])
    assert not missing, missing
