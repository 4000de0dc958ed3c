"""Named SQL queries: one file each, loaded by name, parameters always bound.

A query includes shared CTEs (`SHARED`, one file each) by naming the file in braces where
they go in its WITH list: `{request_engines}`.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

#: Files of CTEs that queries include rather than copy (see `include`).
SHARED = (
    "request_engines",
    "batch_in_flight",
    "heavy_in_flight",
    "in_flight_gaps",
    "cold_requests",
    "cold_set",
    "first_token_waits",
)


def _read(name: str) -> str:
    if not name.replace("_", "").isalnum():
        raise ValueError(f"invalid query name {name!r}")
    return resources.files(__name__).joinpath(f"{name}.sql").read_text(encoding="utf-8")


def include(sql: str) -> str:
    """Gives `sql` with each `{name}` of a SHARED file replaced by that file's CTEs."""
    for name in SHARED:
        marker = "{" + name + "}"
        if marker in sql:
            sql = sql.replace(marker, _read(name).strip())
    return sql


@cache
def load(name: str) -> str:
    """Gives the text of `queries/<name>.sql`, its shared CTEs included."""
    return include(_read(name))
