"""docs/design.md, the map a maintainer reads first: the sections code cites exist, and the
modules, docs and anchors it names are there."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"
#: Where code, tests and docs that may cite the design live (build outputs are not read).
CITING = ("analyzer", "app", "benchmarks", "collector", "docs", "examples", "instrumentation",
          "scripts", "store", "tests", "web")  # fmt: skip

CITATION = re.compile(r"docs/design\.md §(\d+)((?:, §\d+)*)")
#: A path in backticks that names a module or folder of the tree: `collector/writer.py`.
MODULE = re.compile(r"`((?:analyzer|app|collector|examples|instrumentation|store|web)/[\w/.<>-]*)")
LINK = re.compile(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)")


def _sections() -> set[str]:
    return set(re.findall(r"^## (\d+)\. ", DESIGN.read_text(encoding="utf-8"), re.M))


def _slug(heading: str) -> str:
    """Gives a heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", doc.read_text(encoding="utf-8"), re.M)}


def test_every_cited_section_exists() -> None:
    sections = _sections()
    assert sections == {"1", "2", "3", "4", "5", "6"}
    texts = [*REPO.glob("*.md")] + [
        p for folder in CITING for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".md")
    ]
    cited = 0
    for path in texts:
        for first, more in CITATION.findall(path.read_text(encoding="utf-8")):
            numbers = [first, *re.findall(r"\d+", more)]
            cited += len(numbers)
            absent = [n for n in numbers if n not in sections]
            assert not absent, f"{path.relative_to(REPO)} cites docs/design.md §{absent}"
    assert cited > 30  # the code does cite it: a pattern that matches nothing checks nothing


def test_every_module_the_map_names_exists() -> None:
    named = MODULE.findall(DESIGN.read_text(encoding="utf-8"))
    assert len(named) > 20
    for name in named:
        path = name.split("::")[0].split(" ")[0]
        if "<" in path:  # a pattern: `analyzer/diagnosis/<signal>.py`
            path = path[: path.index("<")]
        assert (REPO / path).exists(), f"docs/design.md names {name}, which is not in the tree"


def test_every_link_of_the_map_leads_somewhere() -> None:
    links = LINK.findall(DESIGN.read_text(encoding="utf-8"))
    assert links
    for target, anchor in links:
        doc = (DESIGN.parent / target).resolve() if target else DESIGN
        assert doc.exists(), target
        if anchor:
            assert anchor in _anchors(doc), f"{target}#{anchor}"
