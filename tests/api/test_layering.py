"""The facade's modules import in one direction: the order docs/architecture.md declares.

docs/architecture.md lists the package's modules bottom-up; a module may import only modules
listed before it, so that there is no import cycle. Read from the source with ``ast``, without
importing jaxmg, every import counts, module-level or inside a function.
"""

import ast
import importlib.util
import pathlib
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("once_per_suite")

PACKAGE = "jaxmg"


def _package_dir() -> Path:
    spec = importlib.util.find_spec(PACKAGE)  # finds the package without running it
    return Path(next(iter(spec.submodule_search_locations)))


def _modules(package_dir: Path) -> dict[str, str]:
    """Module name (``_api``, ``__init__``) -> source, for every module of the package."""
    return {p.stem: p.read_text() for p in sorted(package_dir.glob("*.py"))}


ARCHITECTURE = pathlib.Path(__file__).parents[2] / "docs" / "architecture.md"


def _declared_order(text: str | None = None) -> list[str]:
    """The module names of docs/architecture.md's list under "Modules, bottom-up" (or of
    ``text``), in order."""
    text = ARCHITECTURE.read_text() if text is None else text
    _, found, rest = text.partition("### Modules, bottom-up")
    assert found, "docs/architecture.md has no 'Modules, bottom-up' list"
    order = []
    for line in rest.split("\n#", 1)[0].splitlines():
        if line.startswith("- `"):
            names = line.split(": ", 1)[0]  # the names come before the description
            order += re.findall(r"`(\w+)`", names)
    return order


def _imports(source: str, modules) -> set[str]:
    """The package's modules that ``source`` imports (``__init__`` for the package itself)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            bases = [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:  # the package's own modules are one level deep: "." is the package
                base = ".".join(filter(None, [PACKAGE, node.module]))
            bases = [(base, [alias.name for alias in node.names])]
        else:
            continue
        for base, names in bases:
            parts = base.split(".")
            if parts[0] != PACKAGE:
                continue  # another package (jax, jaxmg_layout, jaxmg_cuda, ...)
            if len(parts) > 1:
                found.add(parts[1])
                continue
            targets = {name for name in names if name in modules}  # from jaxmg import _api
            found |= targets or {"__init__"}  # import jaxmg, from jaxmg import potrs
    return found


def _against_order(modules: dict[str, str], order: list[str]) -> list[str]:
    """Every import of a module listed at or after the importing one."""
    rank = {name: i for i, name in enumerate(order)}
    wrong = []
    for name, source in modules.items():
        for target in sorted(_imports(source, modules)):
            if rank[target] >= rank[name]:
                wrong.append(f"{name} imports {target}, which is not listed before it")
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


def test_the_declared_order_lists_every_module_once():
    modules = _modules(_package_dir())
    order = _declared_order()
    assert len(order) == len(set(order)), f"listed twice: {order}"
    assert set(order) == set(modules), (
        f"docs/architecture.md lists {sorted(set(order) - set(modules))} that do not "
        f"exist and misses {sorted(set(modules) - set(order))}: give every module its place"
    )


def test_every_import_goes_down_the_declared_order():
    modules = _modules(_package_dir())
    assert _against_order(modules, _declared_order()) == []


def test_the_package_has_no_import_cycle():
    modules = _modules(_package_dir())
    graph = {name: _imports(source, modules) for name, source in modules.items()}
    assert "_local" in graph["_programs"]  # the graph is read: the programs run local bodies
    assert _cycles(graph) == []


def test_the_checks_see_an_import_upwards_and_a_cycle():
    """The checks themselves, on made-up modules: an import of a higher module, in every
    spelling, is reported, and so is a cycle."""
    order = ["_low", "_high", "__init__"]
    for spelling in (
        "from . import _high",
        "from ._high import thing",
        "from jaxmg._high import thing",
        "import jaxmg._high",
        "def f():\n    from ._high import thing",
    ):
        modules = {"_low": spelling, "_high": "from . import _low", "__init__": ""}
        assert _against_order(modules, order) == [
            "_low imports _high, which is not listed before it"
        ], spelling
        graph = {name: _imports(source, modules) for name, source in modules.items()}
        assert _cycles(graph) == [["_high", "_low", "_high"]], spelling
    modules = {"_low": "import jaxmg\nimport jaxmg_layout", "_high": "", "__init__": ""}
    assert _imports(modules["_low"], modules) == {"__init__"}
    text = "x\n\n### Modules, bottom-up\n\n- `_a` and `_b`: `c`\n\n## Next\n\n- `_d`: e\n"
    assert _declared_order(text) == ["_a", "_b"]
