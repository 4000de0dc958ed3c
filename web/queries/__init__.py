"""The web pages' named SQL: one file each, loaded by name, parameters always bound."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def load(name: str) -> str:
    """Gives the text of `queries/<name>.sql`."""
    if not name.replace("_", "").isalnum():
        raise ValueError(f"invalid query name {name!r}")
    return resources.files(__name__).joinpath(f"{name}.sql").read_text(encoding="utf-8")
