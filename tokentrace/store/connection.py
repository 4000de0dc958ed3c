"""Opening the DuckDB file: one writable connection per process, read-only elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb

from tokentrace.store.location import (
    DB_ENV,
    DEFAULT_DB,
    DEFAULT_MEMORY_LIMIT,
    MEMORY_LIMIT_ENV,
    resolve_db_path,
)
from tokentrace.store.schema import migrate

__all__ = [
    "DB_ENV",
    "DEFAULT_DB",
    "DEFAULT_MEMORY_LIMIT",
    "MEMORY_LIMIT_ENV",
    "StoreError",
    "open_db",
    "open_read_only",
    "resolve_db_path",
]


class StoreError(RuntimeError):
    """The database could not be opened or used."""


def open_db(
    path: str | os.PathLike[str] | None = None,
    *,
    memory_limit: str | None = None,
    checkpoint_threshold: str | None = None,
) -> duckdb.DuckDBPyConnection:
    """Opens (creating and migrating) the database for writing.

    `memory_limit` (DuckDB syntax: "256MB", "2GB") → $TOKENTRACE_DUCKDB_MEMORY_LIMIT
    → `DEFAULT_MEMORY_LIMIT` bounds DuckDB's share of the process's memory.
    `checkpoint_threshold` (same syntax; DuckDB's default when None) is the
    write-ahead log size at which DuckDB checkpoints.

    A new database file is created readable by its owner only (0600: it holds
    traces, prompts if recorded); an existing file's mode is left as it is.  The
    files DuckDB makes beside it later (`<db>.wal`, re-created after each
    checkpoint, and the `<db>.tmp` spill directory) follow the process's umask:
    the processes tokentrace owns (`serve`, `import`, `demo`) narrow it first
    with `keep_store_private`; a host program embedding the store keeps its own."""
    db_path = resolve_db_path(path)
    limit = memory_limit or os.environ.get(MEMORY_LIMIT_ENV) or DEFAULT_MEMORY_LIMIT
    config: dict[str, str | bool | int | float | list[str]] = {"memory_limit": limit}
    if checkpoint_threshold:
        config["checkpoint_threshold"] = checkpoint_threshold
    # DuckDB creates its files with 0666 & ~umask: while it may create the database
    # file, the umask is the strictest one (a file another thread creates meanwhile
    # is at worst too private, never readable by others)
    previous = os.umask(_PRIVATE)
    try:
        return _connect_and_migrate(db_path, config)
    finally:
        os.umask(previous)


def _connect_and_migrate(
    db_path: Path, config: dict[str, str | bool | int | float | list[str]]
) -> duckdb.DuckDBPyConnection:
    try:
        conn = duckdb.connect(str(db_path), config=config)
    except duckdb.Error as exc:
        given = ", ".join(f"{key} {value!r}" for key, value in config.items())
        raise StoreError(f"cannot open {db_path} ({given}): {exc}") from exc
    foreign = _foreign_tables(conn)
    if foreign:
        conn.close()
        shown = ", ".join(foreign[:5]) + (
            f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        raise StoreError(
            f"{db_path} is another program's DuckDB database (tables {shown}), not a "
            "tokentrace one: tokentrace adds its tables only to its own files; give another --db"
        )
    migrate(conn)
    return conn


#: The group and other permission bits: what a new database file does not give.
_PRIVATE = 0o077


def keep_store_private(path: str | os.PathLike[str] | None) -> None:
    """Narrows this process's umask so that the files DuckDB makes beside the
    database at any time (`<db>.wal`, again after each checkpoint; spill files)
    are no more readable than the database they copy: by its owner only for a
    new file, by whom the existing file's mode allows otherwise.  For processes
    tokentrace owns (`serve`, `import`, `demo`): the umask is process-wide."""
    try:
        mode = os.stat(resolve_db_path(path)).st_mode
    except OSError:  # a new file: open_db creates it 0600
        mode = 0o600
    previous = os.umask(0)
    os.umask(previous | (_PRIVATE & ~mode))


def _foreign_tables(conn: duckdb.DuckDBPyConnection) -> list[str]:
    """Gives the tables and views of a database tokentrace never set up (no
    `schema_version`), so that opening someone else's file for writing does not
    add tokentrace's tables to it; [] for a new or a tokentrace database."""
    names = [
        row[0]
        for row in conn.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_catalog = current_database() ORDER BY table_name"
        ).fetchall()
    ]
    return [] if "schema_version" in names else names


def open_read_only(path: str | os.PathLike[str] | None = None) -> duckdb.DuckDBPyConnection:
    """Opens an existing database read-only (for reports and exports)."""
    db_path = resolve_db_path(path)
    if not db_path.exists():
        raise StoreError(
            f"no tokentrace database at {db_path} (run `tokentrace serve` or `tokentrace import` first)"
        )
    try:
        return duckdb.connect(str(db_path), read_only=True)
    except duckdb.Error as exc:
        raise StoreError(f"cannot open {db_path}: {exc}") from exc
