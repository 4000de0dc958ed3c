"""Opening the DuckDB file: one writable connection per process, read-only elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from tokentrace.store.schema import migrate

#: Environment variable naming the database file (DESIGN.md §6).
DB_ENV = "TOKENTRACE_DB"
DEFAULT_DB = "tokentrace.duckdb"


class StoreError(RuntimeError):
    """The database could not be opened or used."""


def resolve_db_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Gives the database path: explicit argument → $TOKENTRACE_DB → ./tokentrace.duckdb."""
    return Path(explicit or os.environ.get(DB_ENV) or DEFAULT_DB)


def open_db(path: str | os.PathLike[str] | None = None) -> duckdb.DuckDBPyConnection:
    """Opens (creating and migrating) the database for writing."""
    db_path = resolve_db_path(path)
    try:
        conn = duckdb.connect(str(db_path))
    except duckdb.Error as exc:
        raise StoreError(f"cannot open {db_path}: {exc}") from exc
    migrate(conn)
    return conn


def open_read_only(path: str | os.PathLike[str] | None = None) -> duckdb.DuckDBPyConnection:
    """Opens an existing database read-only (for reports and exports)."""
    db_path = resolve_db_path(path)
    if not db_path.exists():
        raise StoreError(f"no tokentrace database at {db_path} (run `tokentrace serve` or `tokentrace import` first)")
    try:
        return duckdb.connect(str(db_path), read_only=True)
    except duckdb.Error as exc:
        raise StoreError(f"cannot open {db_path}: {exc}") from exc
