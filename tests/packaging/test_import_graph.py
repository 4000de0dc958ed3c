"""The parts meet only in the composition root (tokentrace.serve): no import between the
collector and the web explorer, and the analyzer imports neither (docs/design.md)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: source folder → the package it installs as (setup.py's FOLDERS)
PACKAGES = {"collector": "tokentrace.collector", "web": "tokentrace.web", "analyzer": "tokentrace.analyzer"}


def imported(source: str, module: str, is_package: bool = False) -> Iterator[str]:
    """Gives every module name `source` (the text of `module`) imports, anywhere in it
    (inside functions too), relative imports resolved; `from a import b` gives `a.b`
    as well, since `b` may be a module."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def modules(folder: str) -> Iterator[tuple[Path, str, bool]]:
    """Gives each Python file under `folder` with its module name and whether it is a package."""
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT / folder).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield path, ".".join([PACKAGES[folder], *parts]), rel.name == "__init__"


def reaching(folder: str, other: str) -> list[str]:
    """Gives `file: module` for each import under `folder` of the package `other`."""
    target = PACKAGES[other]
    found = []
    for path, module, is_package in modules(folder):
        for name in imported(path.read_text(encoding="utf-8"), module, is_package):
            if name == target or name.startswith(target + "."):
                found.append(f"{path.relative_to(ROOT)}: {name}")
    return found


@pytest.mark.parametrize(
    ("folder", "other"),
    [("collector", "web"), ("web", "collector"), ("analyzer", "collector"), ("analyzer", "web")],
)
def test_no_import_crosses_between_the_parts(folder: str, other: str) -> None:
    assert list(modules(folder)), f"no modules under {folder}/"
    assert reaching(folder, other) == []


@pytest.mark.parametrize(
    ("source", "module", "is_package"),
    [
        ("import tokentrace.web.app", "tokentrace.collector.m", False),
        ("from tokentrace.web.app import create_web_app", "tokentrace.collector.m", False),
        ("from tokentrace import web", "tokentrace.collector.m", False),
        ("from ..web import app", "tokentrace.collector.m", False),
        ("from .. import web", "tokentrace.collector.m", False),
        ("from ...web import app", "tokentrace.collector.sub.m", False),
        ("from ...web import app", "tokentrace.collector.sub", True),
        ("def later():\n    from tokentrace.web.app import create_web_app\n", "tokentrace.collector.m", False),
    ],
)
def test_every_way_of_writing_an_import_is_seen(source: str, module: str, is_package: bool) -> None:
    names = set(imported(source, module, is_package))
    assert any(n == "tokentrace.web" or n.startswith("tokentrace.web.") for n in names), names


def test_a_sibling_module_is_not_mistaken_for_the_other_part() -> None:
    names = set(imported("from . import webhooks\nimport tokentrace.website", "tokentrace.collector.m"))
    assert not any(n == "tokentrace.web" or n.startswith("tokentrace.web.") for n in names), names


def test_the_names_both_parts_share_import_nothing() -> None:
    tree = ast.parse((ROOT / "store" / "reasons.py").read_text(encoding="utf-8"))
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in imports)
