"""The facade's folders are its layers, and imports go down them: the order docs/architecture.md
declares.

docs/architecture.md lists the layers bottom-up (a folder such as ``engines/``, or a module
directly in the package); a module may import modules of its own layer or of a layer listed
before it, and no module may take part in an import cycle. Read from the source with ``ast``,
without importing jaxmg: every import counts, module-level or inside a function. Also held here:
the few modules directly in ``jaxmg/``, and the one module that reads a backend's name.
"""

import ast
import importlib.util
import pathlib
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("once_per_suite")

PACKAGE = "jaxmg"
ARCHITECTURE = pathlib.Path(__file__).parents[2] / "docs" / "architecture.md"

#: The values of ``backend=`` (and the internal ``"jax"``).
ENGINE_NAMES = {"mg", "mp", "jax"}


def _package_dir() -> Path:
    spec = importlib.util.find_spec(PACKAGE)  # finds the package without running it
    return Path(next(iter(spec.submodule_search_locations)))


def _modules(package_dir: Path) -> dict[str, str]:
    """Module name relative to the package (``utils``, ``engines.mg``, ``engines`` for
    ``engines/__init__.py``, ``__init__`` for the package's own) -> source."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        modules[".".join(parts)] = path.read_text()
    return modules


def _is_package(name: str, modules) -> bool:
    return name == "__init__" or any(other.startswith(name + ".") for other in modules)


def _declared_layers(text: str | None = None) -> list[str]:
    """The layers of docs/architecture.md's list under "Layers, bottom-up" (or of ``text``), in
    order: ``engines/`` for a folder, ``utils`` for a module."""
    text = ARCHITECTURE.read_text() if text is None else text
    _, found, rest = text.partition("### Layers, bottom-up")
    assert found, "docs/architecture.md has no 'Layers, bottom-up' list"
    order = []
    for line in rest.split("\n#", 1)[0].splitlines():
        if line.startswith("- `"):
            names = line.split(": ", 1)[0]  # the names come before the description
            order += re.findall(r"`([\w/]+)`", names)
    return order


def _layer_of(module: str, layers: list[str]) -> str | None:
    """The declared layer a module belongs to: its folder's, or its own name's."""
    folder = module.split(".")[0] + "/"
    if folder in layers:
        return folder
    return module if module in layers else None


def _imports(module: str, source: str, modules) -> set[str]:
    """The package's modules that ``module``'s ``source`` imports (``__init__`` for the package
    itself, ``engines`` for a subpackage's ``__init__``)."""
    package = module if _is_package(module, modules) else module.rpartition(".")[0]
    if module == "__init__":
        package = ""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            bases = [(alias.name.split("."), ()) for alias in node.names]
            bases = [(parts[1:], ()) for parts, _ in bases if parts[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                parts = (node.module or "").split(".")
                if parts[0] != PACKAGE:
                    continue  # another package (jax, jaxmg_layout, jaxmg_cuda, ...)
                base = parts[1:]
            else:
                here = package.split(".") if package else []
                up = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                base = up + (node.module.split(".") if node.module else [])
            bases = [(base, [alias.name for alias in node.names])]
        else:
            continue
        for base, names in bases:
            target = ".".join(base)
            children = {f"{target}.{n}" if target else n for n in names}
            children &= set(modules)
            if children:  # from . import checks, from jaxmg.engines import mg
                found |= children
            elif target:
                found.add(target)
            else:
                found.add("__init__")  # import jaxmg, from jaxmg import potrs
    return found - {module}


def _against_layers(modules: dict[str, str], layers: list[str]) -> list[str]:
    """Every import of a module of a layer listed after the importing module's own."""
    rank = {layer: i for i, layer in enumerate(layers)}
    wrong = []
    for name, source in modules.items():
        mine = rank[_layer_of(name, layers)]
        for target in sorted(_imports(name, source, modules)):
            if rank[_layer_of(target, layers)] > mine:
                wrong.append(f"{name} imports {target}, of a layer listed after its own")
    return wrong


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (module -> modules it imports), each once."""
    cycles, done = [], set()

    def visit(node, path):
        if node in path:
            cycle = path[path.index(node) :]
            if set(cycle) not in [set(c) for c in cycles]:
                cycles.append(cycle + [node])
            return
        if node in done:
            return
        for target in sorted(graph.get(node, ())):
            visit(target, path + [node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return cycles


def _reads_a_backend_name(source: str) -> bool:
    """Whether ``source`` compares a value with an engine's name, or looks one up by it
    (``backend == "mp"``, ``ENGINES["mg"]``)."""

    def named(node) -> bool:
        return isinstance(node, ast.Constant) and node.value in ENGINE_NAMES

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(
            named(n) or isinstance(n, ast.Tuple) and any(map(named, n.elts))
            for n in (node.left, *node.comparators)
        ):
            return True
        if isinstance(node, ast.Subscript) and named(node.slice):
            return True
    return False


def test_every_module_has_a_declared_layer():
    modules = _modules(_package_dir())
    layers = _declared_layers()
    assert len(layers) == len(set(layers)), f"listed twice: {layers}"
    assert [m for m in modules if _layer_of(m, layers) is None] == [], (
        "give every module a layer in docs/architecture.md's 'Layers, bottom-up'"
    )
    used = {_layer_of(m, layers) for m in modules}
    assert set(layers) <= used, f"listed but absent: {sorted(set(layers) - used)}"


def test_every_import_goes_down_the_layers():
    modules = _modules(_package_dir())
    assert _against_layers(modules, _declared_layers()) == []


def test_the_package_has_no_import_cycle():
    modules = _modules(_package_dir())
    graph = {name: _imports(name, source, modules) for name, source in modules.items()}
    assert "programs.local" in graph["programs.routines"]  # the graph is read
    assert "engines.mg" in graph["engines"]
    assert _cycles(graph) == []


def test_few_modules_stand_directly_in_the_package():
    """The rest live in the folders of their layers."""
    assert len(list(_package_dir().glob("*.py"))) <= 10


def test_only_the_registry_reads_a_backend_name():
    """What differs between engines is asked of the engine object: the backend's name is read
    only where an engine is chosen (jaxmg.engines) and where each engine names itself."""
    modules = _modules(_package_dir())
    readers = sorted(name for name, source in modules.items() if _reads_a_backend_name(source))
    assert readers == ["engines"]


def test_the_checks_see_an_import_upwards_a_cycle_and_a_name():
    """The checks themselves, on made-up modules: an import of a higher layer, in every
    spelling, is reported, and so is a cycle; a comparison with a backend's name is seen."""
    layers = ["low/", "high/", "__init__"]
    for spelling in (
        "from ..high import thing",
        "from ..high.top import thing",
        "from jaxmg.high.top import thing",
        "from jaxmg.high import top",
        "import jaxmg.high.top",
        "def f():\n    from ..high import top",
    ):
        modules = {
            "low": "",
            "low.base": spelling,
            "high": "",
            "high.top": "from ..low import base",
            "__init__": "",
        }
        wrong = _against_layers(modules, layers)
        assert len(wrong) == 1 and wrong[0].startswith("low.base imports high"), spelling
        graph = {name: _imports(name, source, modules) for name, source in modules.items()}
        if "top" in spelling:
            assert _cycles(graph) == [["high.top", "low.base", "high.top"]], spelling
    modules = {"low": "", "low.base": "import jaxmg\nimport jaxmg_layout", "__init__": ""}
    assert _imports("low.base", modules["low.base"], modules) == {"__init__"}
    assert _imports("low.base", "from . import other", {**modules, "low.other": ""}) == {
        "low.other"
    }
    text = "x\n\n### Layers, bottom-up\n\n- `a/` and `b`: `c`\n\n## Next\n\n- `d`: e\n"
    assert _declared_layers(text) == ["a/", "b"]
    assert _layer_of("a.x", ["a/", "b"]) == "a/" and _layer_of("a", ["a/"]) == "a/"
    assert _reads_a_backend_name("if geometry.backend == 'mp':\n    pass")
    assert _reads_a_backend_name("x = name in ('mg', 'jax')")
    assert _reads_a_backend_name("e = ENGINES['mg']")
    assert not _reads_a_backend_name("name = 'mg'\nif engine.whole:\n    pass")
