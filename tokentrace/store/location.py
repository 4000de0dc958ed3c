"""Where the database file is: $TOKENTRACE_DB, else ./tokentrace.duckdb (DESIGN.md §6).

No DuckDB here: the command line reads these to build its help.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable naming the database file (DESIGN.md §6).
DB_ENV = "TOKENTRACE_DB"
DEFAULT_DB = "tokentrace.duckdb"


def resolve_db_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Gives the database path: explicit argument → $TOKENTRACE_DB → ./tokentrace.duckdb."""
    return Path(explicit or os.environ.get(DB_ENV) or DEFAULT_DB)
