"""The README and docs/: every relative link reaches a file (and a heading, for ``#anchor``),
every page of docs/ is linked from the README, and the README stays a five-minute read."""

import pathlib
import re

import pytest

pytestmark = pytest.mark.usefixtures("once_per_suite")

ROOT = pathlib.Path(__file__).parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set:
    lines = path.read_text().splitlines()
    return {slug(line.lstrip("#")) for line in lines if re.match(r"#{1,6} ", line)}


def links(path: pathlib.Path):
    """``(target file, anchor or None)`` of every relative link in ``path``, code spans and
    fenced blocks left out."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        file, _, anchor = target.partition("#")
        yield (path.parent / file if file else path).resolve(), anchor or None


@pytest.mark.parametrize("document", [README, *PAGES], ids=lambda path: path.name)
def test_every_relative_link_resolves(document):
    for target, anchor in links(document):
        assert target.exists(), f"{document.name}: no {target}"
        if anchor is not None:
            assert anchor in anchors(target), f"{document.name}: no #{anchor} in {target.name}"


def test_every_page_is_reachable_from_the_readme():
    linked = {target for target, _ in links(README)}
    assert PAGES and all(page.resolve() in linked for page in PAGES), [
        page.name for page in PAGES if page.resolve() not in linked
    ]


def test_the_readme_is_short():
    assert len(README.read_text().splitlines()) <= 150


def test_slugs_follow_github():
    assert slug("Coming from jaxmg 0.0.x / 1.x") == "coming-from-jaxmg-00x--1x"
    assert slug('Several nodes: `backend="mp"`') == "several-nodes-backendmp"
