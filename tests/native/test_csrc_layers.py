"""packages/jaxmg-cuda/csrc/ is layered: every ``#include "..."`` goes to a file of its own
layer or of a lower one, in the order csrc/README.md lists the layers (read from there, so the
document and the check cannot drift apart). Pure Python, no build:

    python -m pytest tests/native/test_csrc_layers.py -q

A failure names each include that goes upward, each file in no layer, each ``#include "..."``
of a file that does not exist (csrc's own files are included by their path from csrc/, e.g.
``#include "meeting/protocol.h"``) and each ``#include <...>`` of one of csrc's files.
"""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("once_per_suite")

CSRC = Path(__file__).resolve().parents[2] / "packages" / "jaxmg-cuda" / "csrc"
SOURCES = (".h", ".cc")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.MULTILINE)


def layer_order(readme: str) -> list[str]:
    """The folders of the numbered list under "## Layers", lowest layer (1.) first."""
    section = re.search(r"^## Layers\n(.*?)(?=^## |\Z)", readme, re.MULTILINE | re.DOTALL)
    if section is None:
        raise ValueError('csrc/README.md has no "## Layers" section')
    entries = re.findall(r"^(\d+)\. `([\w-]+)/`", section.group(1), re.MULTILINE)
    numbers = [int(n) for n, _ in entries]
    if numbers != list(range(1, len(entries) + 1)):
        raise ValueError(f"the layers are not numbered 1, 2, ... in order: {numbers}")
    return [folder for _, folder in entries]


def include_problems(csrc: Path, layers: list[str]) -> list[str]:
    """Every violation of the layering in `csrc`, one line each; [] when there is none."""
    rank = {folder: i for i, folder in enumerate(layers)}
    problems = [
        f"layer {folder}/ (csrc/README.md) is not a folder of csrc/"
        for folder in layers
        if not (csrc / folder).is_dir()
    ]
    for path in sorted(p for p in csrc.rglob("*") if p.is_file() and p.suffix in SOURCES):
        name = path.relative_to(csrc).as_posix()
        layer = name.split("/")[0] if "/" in name else None
        if layer not in rank:
            problems.append(f"{name}: in no layer (not under a folder csrc/README.md lists)")
            continue
        text = path.read_text()
        for match in INCLUDE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            bracket, target = match.groups()
            resolved = (csrc / target).resolve()
            inside = resolved.is_relative_to(csrc.resolve())
            if bracket == "<":
                if inside and resolved.is_file():
                    problems.append(
                        f'{name}:{line}: includes <{target}>, one of csrc\'s files: use "..."'
                    )
                continue
            if not inside or not resolved.is_file():
                problems.append(
                    f'{name}:{line}: includes "{target}", which is not a file of csrc/ '
                    "(csrc's files are included by their path from csrc/)"
                )
                continue
            to = resolved.relative_to(csrc.resolve()).as_posix()
            to_layer = to.split("/")[0] if "/" in to else None
            if to_layer not in rank:
                problems.append(f'{name}:{line}: includes "{target}", which is in no layer')
            elif rank[to_layer] > rank[layer]:
                problems.append(
                    f'{name}:{line}: includes "{target}": layer {to_layer}/ '
                    f"({rank[to_layer] + 1}) is above {layer}/ ({rank[layer] + 1})"
                )
    return problems


def test_readme_lists_the_layers():
    layers = layer_order((CSRC / "README.md").read_text())
    assert len(layers) >= 2
    folders = sorted(p.name for p in CSRC.iterdir() if p.is_dir())
    assert sorted(layers) == folders, "csrc/README.md's layers are not csrc's folders"


def test_csrc_includes_only_downward():
    layers = layer_order((CSRC / "README.md").read_text())
    problems = include_problems(CSRC, layers)
    assert not problems, "csrc/ breaks its layering:\n" + "\n".join(problems)


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_check_names_each_kind_of_violation(tmp_path):
    """The check itself, on a small tree: what it must report, and what it must accept."""
    csrc = write(
        tmp_path,
        {
            "low/a.h": '#include "low/b.h"\n#include <vector>\n',
            "low/b.h": "",
            "high/c.h": '#include "low/a.h"\n#include "high/d.h"\n',
            "high/d.h": '#include <cstdint>\n\n#include "high/c.h"\n',
            "low/up.cc": '#include "low/a.h"\n  #  include "high/c.h"\n',
            "stray.h": "",
            "other/e.h": "",
            "low/missing.cc": '#include "low/nothing.h"\n',
            "low/relative.cc": '#include "b.h"\n',
            "low/angle.cc": "#include <low/b.h>\n",
        },
    )
    assert include_problems(csrc, ["low", "high"]) == [
        'low/angle.cc:1: includes <low/b.h>, one of csrc\'s files: use "..."',
        'low/missing.cc:1: includes "low/nothing.h", which is not a file of csrc/ '
        "(csrc's files are included by their path from csrc/)",
        'low/relative.cc:1: includes "b.h", which is not a file of csrc/ '
        "(csrc's files are included by their path from csrc/)",
        'low/up.cc:2: includes "high/c.h": layer high/ (2) is above low/ (1)',
        "other/e.h: in no layer (not under a folder csrc/README.md lists)",
        "stray.h: in no layer (not under a folder csrc/README.md lists)",
    ]
    # The same tree, layers in the other order: now every include from high/ to low/ is upward.
    problems = include_problems(csrc, ["high", "low", "gone"])
    assert "layer gone/ (csrc/README.md) is not a folder of csrc/" in problems
    assert 'high/c.h:1: includes "low/a.h": layer low/ (2) is above high/ (1)' in problems
    assert not any(p.startswith("low/up.cc:2") for p in problems)


def test_layer_order_reads_the_numbered_list():
    readme = (
        "# csrc\n\n## Layers\nLowest first.\n\n1. `vendor/` NVIDIA\n2. `base/` words\n"
        "3. `top/` the rest\n\n## Elsewhere\n1. `not/` a layer\n"
    )
    assert layer_order(readme) == ["vendor", "base", "top"]
    with pytest.raises(ValueError, match="numbered"):
        layer_order("## Layers\n1. `a/` x\n3. `b/` y\n")
    with pytest.raises(ValueError, match='no "## Layers"'):
        layer_order("# csrc\n1. `a/` x\n")
