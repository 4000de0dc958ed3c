"""The web pages' named SQL: one file each, loaded by name, parameters always bound.

A query includes the analyzer's shared CTEs as the analyzer's own queries do
(`tokentrace.analyzer.queries.include`): one definition of, say, a request's engine.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from tokentrace.analyzer.queries import include


@cache
def load(name: str) -> str:
    """Gives the text of `queries/<name>.sql`, the analyzer's shared CTEs included."""
    if not name.replace("_", "").isalnum():
        raise ValueError(f"invalid query name {name!r}")
    return include(resources.files(__name__).joinpath(f"{name}.sql").read_text(encoding="utf-8"))
