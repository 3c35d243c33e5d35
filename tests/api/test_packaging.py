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


def _pins(requirements):
    return sorted(r for r in requirements if r.startswith("jaxmg-"))


def test_one_version_released_together():
    versions = {name: project(name)["version"] for name in NAMES}
    assert len(set(versions.values())) == 1, versions
    major_minor = ".".join(versions["jaxmg"].split(".")[:2])
    jaxmg = project("jaxmg")
    assert _pins(jaxmg["dependencies"]) == [f"jaxmg-layout == {major_minor}.*"]
    extras = jaxmg["optional-dependencies"]
    for extra in ("cuda", "mpi"):  # the native engines (mpi: backend "mp"'s)
        assert _pins(extras[extra]) == [f"jaxmg-cuda == {major_minor}.*"], extra
    for name in NAMES:  # what is installed is what the pyproject says
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            assert name == "jaxmg-cuda", f"{name} is not installed"  # optional: jaxmg[cuda]
            continue
        assert installed == versions[name]


def test_jaxmg_is_pure_python():
    """jaxmg installs with jax, numpy and jaxmg-layout alone: the native engines (jaxmg-cuda)
    are the extras ``cuda`` and ``mpi``, and no other extra pulls them in."""
    jaxmg = project("jaxmg")
    names = [re.split(r"[\s=<>!~\[;]", r, maxsplit=1)[0] for r in jaxmg["dependencies"]]
    assert sorted(names) == ["jax", "jaxmg-layout", "numpy"]
    pulling = sorted(e for e, reqs in jaxmg["optional-dependencies"].items() if _pins(reqs))
    assert pulling == ["cuda", "mpi"]


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
