"""Opening the DuckDB file: one writable connection per process, read-only elsewhere."""

from __future__ import annotations

import logging
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

import duckdb

from tokentrace.store.errors import StoreError
from tokentrace.store.held import DatabaseHeld, is_held
from tokentrace.store.location import (
    DB_ENV,
    DEFAULT_DB,
    DEFAULT_MEMORY_LIMIT,
    MEMORY_LIMIT_ENV,
    resolve_db_path,
)
from tokentrace.store.schema import check_version, migrate

__all__ = [
    "DB_ENV",
    "DEFAULT_DB",
    "DEFAULT_MEMORY_LIMIT",
    "MEMORY_LIMIT_ENV",
    "DatabaseHeld",
    "StoreError",
    "open_db",
    "open_read_only",
    "resolve_db_path",
]

logger = logging.getLogger("tokentrace.store")


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
    with `keep_store_private`; a host program embedding the store keeps its own.
    An existing file that its group or others can read is opened all the same,
    with one warning that says how to make it private.

    Raises StoreError, before anything is written, when this process could not
    write the file or create files beside it (DuckDB creates `<db>.wal` at the
    first write: without the check, a start went well and the first writes
    failed); `DatabaseHeld` when another process has the file open."""
    db_path = resolve_db_path(path)
    _check_writable(db_path)
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
        conn = _connect(db_path, config=config)
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
    try:
        migrate(conn, db_path)
    except BaseException:
        conn.close()  # else this process keeps the file locked
        raise
    _warn_if_readable_by_others(db_path)  # a tokentrace database: another program's is refused
    return conn


def _wal(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + ".wal")


def _check_writable(db_path: Path) -> None:
    """Raises StoreError when this process could not write the database `db_path`:
    the file (if it exists) and its log must be writable, and the directory must
    take a new file and let it be removed, as DuckDB's `<db>.wal` is (made at the
    first write, deleted at each checkpoint).  A probe file is created and removed
    there; the database itself is not opened (closing a descriptor of a file would
    drop the locks this process may hold on it)."""
    for path in (db_path, _wal(db_path)):
        reason = _unwritable(path)
        if reason:
            raise StoreError(f"cannot write {path}: {reason}")
    where = db_path.parent
    if not where.is_dir():
        raise StoreError(f"cannot create {db_path}: no directory {where}")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{db_path.name}.", suffix=".write-check", dir=where)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise StoreError(
            f"cannot write beside {db_path} (DuckDB needs {_wal(db_path)} there): "
            f"{where}: {exc.strerror or exc}"
        ) from exc


def _unwritable(path: Path) -> str | None:
    """Gives why this process cannot write the existing file `path`, None when it can
    (or there is none)."""
    if not path.is_file():
        return None
    effective = {"effective_ids": True} if os.access in os.supports_effective_ids else {}
    if os.access(path, os.W_OK, **effective):
        return None
    try:  # refused, as access() said: for the OS's reason (no descriptor is made)
        os.close(os.open(path, os.O_WRONLY))
    except OSError as exc:
        return str(exc.strerror or exc)
    return None


def _warn_if_readable_by_others(db_path: Path) -> None:
    """Logs a warning when group or others can read the database file (made by an
    older tokentrace, or under a wide umask by hand): it holds traces, and prompts
    where recorded, which its readers see without the web UI's token."""
    try:
        mode = stat.S_IMODE(db_path.stat().st_mode)
    except OSError:
        return
    who = [
        name for bit, name in ((stat.S_IRGRP, "its group"), (stat.S_IROTH, "others")) if mode & bit
    ]
    if who:
        logger.warning(
            "tokentrace: %s is readable by %s (mode %04o): it holds traces (prompts too, where "
            "recorded), readable there without the web UI's token; unless it is shared on "
            "purpose: chmod 600 %s (the log DuckDB makes beside it then follows)",
            db_path, " and ".join(who), mode, db_path,
        )  # fmt: skip


#: DuckDB's words for a write-ahead log it cannot replay (a torn or corrupt `<db>.wal`).
_CORRUPT_WAL = re.compile(r"Failure while replaying WAL|Corrupt WAL", re.IGNORECASE)


def _connect(db_path: Path, **options: Any) -> duckdb.DuckDBPyConnection:
    """Connects to `db_path`, for writing or read-only; a file another process holds
    raises DatabaseHeld (who holds it), a log DuckDB cannot replay a StoreError that
    says how to open the database without it.  Other DuckDB errors pass through."""
    try:
        return duckdb.connect(str(db_path), **options)
    except duckdb.Error as exc:
        said = str(exc)
        if is_held(said):
            raise DatabaseHeld(db_path, said) from exc
        if _CORRUPT_WAL.search(said):
            raise StoreError(_corrupt_wal_message(db_path, said)) from exc
        raise


def _corrupt_wal_message(db_path: Path, duckdb_said: str) -> str:
    wal = _wal(db_path)
    found = re.search(r"Corrupt WAL.*", duckdb_said, re.IGNORECASE)
    detail = (found.group(0) if found else duckdb_said).strip().splitlines()[0]
    return (
        f"cannot open {db_path}: its write-ahead log {wal} cannot be replayed ({detail}): "
        f"move it aside (mv {wal} {db_path}.wal-corrupt) to open the database as of its last "
        "checkpoint; what only the log held is lost"
    )


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
    """Opens an existing database read-only (for reports and exports).

    Raises StoreError for a database a newer tokentrace wrote (its tables are not
    what this one reads), `DatabaseHeld` when another process has it open."""
    db_path = resolve_db_path(path)
    if not db_path.exists():
        raise StoreError(
            f"no tokentrace database at {db_path} (run `tokentrace serve` or `tokentrace import` first)"
        )
    try:
        conn = _connect(db_path, read_only=True)
    except duckdb.Error as exc:
        raise StoreError(f"cannot open {db_path}: {exc}") from exc
    try:
        check_version(conn, db_path)
    except BaseException:
        conn.close()
        raise
    return conn
