"""Where the database file is: $TOKENTRACE_DB, else ./tokentrace.duckdb (docs/design.md §6).

No DuckDB here: the command line reads these to build its help.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable naming the database file (docs/design.md §6).
DB_ENV = "TOKENTRACE_DB"
DEFAULT_DB = "tokentrace.duckdb"
#: Environment variable bounding DuckDB's memory in the writing process.
MEMORY_LIMIT_ENV = "TOKENTRACE_DUCKDB_MEMORY_LIMIT"
#: DuckDB's own default is 80 % of RAM, and its buffer pool keeps every block
#: it wrote cached until that limit: a collector's RSS then grows with the
#: amount of data stored, not with its buffer settings.  Inserts need little;
#: bigger queries spill to `<db>.tmp` instead of growing the process.
DEFAULT_MEMORY_LIMIT = "256MB"


def resolve_db_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Gives the database path: explicit argument → $TOKENTRACE_DB → ./tokentrace.duckdb."""
    return Path(explicit or os.environ.get(DB_ENV) or DEFAULT_DB)
