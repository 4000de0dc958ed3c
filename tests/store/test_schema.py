"""Schema migrations on a real DuckDB file: fresh files and files an older tokentrace wrote;
a migration that cannot commit, and a file a newer tokentrace wrote, say so in one line."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from tt_testkit import unwritable

from tokentrace.cli import main
from tokentrace.store import schema
from tokentrace.store.connection import StoreError, open_db, open_read_only


def _older_file(db: Path, versions: tuple[int, ...]) -> duckdb.DuckDBPyConnection:
    """Gives a connection to a new file as an older tokentrace left it: these migrations applied."""
    conn = duckdb.connect(str(db))
    conn.execute(
        "CREATE TABLE schema_version (version INTEGER NOT NULL, applied_at TIMESTAMP NOT NULL)"
    )
    for version in versions:
        for statement in schema._MIGRATIONS[version]:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_version VALUES (?, now())", [version])
    return conn


def _indexes(path: Path) -> set[str]:
    conn = duckdb.connect(str(path), read_only=True)
    try:
        return {
            row[0] for row in conn.execute("SELECT index_name FROM duckdb_indexes()").fetchall()
        }
    finally:
        conn.close()


def test_a_fresh_file_gets_every_table_and_no_requests_index(tmp_path: Path) -> None:
    db = tmp_path / "fresh.duckdb"
    open_db(db).close()
    assert _indexes(db) == {"spans_trace", "kept_trace"}
    conn = duckdb.connect(str(db), read_only=True)
    try:
        versions = [
            row[0]
            for row in conn.execute("SELECT version FROM schema_version ORDER BY 1").fetchall()
        ]
    finally:
        conn.close()
    assert versions == list(range(1, schema.SCHEMA_VERSION + 1))


def test_a_version_1_file_keeps_its_rows_and_loses_the_requests_index(tmp_path: Path) -> None:
    db = tmp_path / "v1.duckdb"
    conn = _older_file(db, (1,))
    conn.execute(
        "INSERT INTO kept_traces (trace_id, reason, weight, decided_ns, span_count) VALUES ('t1', 'error', 1.0, 1, 3)"
    )
    conn.close()
    assert "requests_trace" in _indexes(db)
    conn = open_db(db)
    try:
        assert schema.current_version(conn) == schema.SCHEMA_VERSION
        assert conn.execute("SELECT trace_id, reason FROM kept_traces").fetchall() == [
            ("t1", "error")
        ]
    finally:
        conn.close()
    assert _indexes(db) == {"spans_trace", "kept_trace"}


def test_a_version_2_file_keeps_its_steps_and_gains_forward_host_us(tmp_path: Path) -> None:
    db = tmp_path / "v2.duckdb"
    conn = _older_file(db, (1, 2))
    conn.execute("INSERT INTO engine_steps VALUES ('svc', 'i', 1, 2, 3, 4, 5, 6, 0.5, 700, ['r1'])")
    conn.close()
    conn = open_db(db)
    try:
        assert conn.execute(
            "SELECT gpu_us, forward_host_us, request_ids FROM engine_steps"
        ).fetchall() == [(700, None, ["r1"])]
    finally:
        conn.close()


def _newer_file(db: Path) -> Path:
    open_db(db).close()
    conn = duckdb.connect(str(db))
    conn.execute("INSERT INTO schema_version VALUES (?, now())", [schema.SCHEMA_VERSION + 1])
    conn.close()
    return db


def test_a_newer_file_is_refused(tmp_path: Path) -> None:
    db = _newer_file(tmp_path / "new.duckdb")
    with pytest.raises(RuntimeError, match="newer than this tokentrace"):
        open_db(db)


NEWER = "database schema version {v} is newer than this tokentrace ({mine}); upgrade tokentrace"


def test_a_newer_file_is_refused_by_report_and_requests_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """They read it with this version's queries: DuckDB's "Binder Error: Referenced column
    … not found" said nothing of versions (operator review)."""
    db = _newer_file(tmp_path / "new.duckdb")
    said = NEWER.format(v=schema.SCHEMA_VERSION + 1, mine=schema.SCHEMA_VERSION)
    with pytest.raises(StoreError) as caught:
        open_read_only(db)
    assert str(caught.value) == f"{db}: {said}"
    export = tmp_path / "export.json"
    export.write_text("{}")
    for command in ("report", "requests", "import"):
        args = [command, "--db", str(db)] + ([str(export)] if command == "import" else [])
        assert main(args) == 1
        assert capsys.readouterr().err == f"tokentrace {command}: {db}: {said}\n"


def test_an_older_file_still_reads_without_being_migrated(tmp_path: Path) -> None:
    db = tmp_path / "v1.duckdb"
    _older_file(db, (1,)).close()
    conn = open_read_only(db)
    try:
        assert schema.current_version(conn) == 1
    finally:
        conn.close()


def test_a_migration_that_cannot_commit_says_why(tmp_path: Path) -> None:
    """The COMMIT failed (DuckDB could not create the log), then the ROLLBACK's own
    "cannot rollback - no transaction is active" replaced that error: the user saw
    `unexpected TransactionException` about a rollback (operator review)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    db = folder / "v1.duckdb"
    # connected before the directory turns read-only, as `open_db` connects; its own
    # check would refuse such a directory before migrating (tests/store/test_writable.py)
    conn = _older_file(db, (1,))
    conn.execute("CHECKPOINT")
    try:
        with unwritable(folder), pytest.raises(StoreError) as caught:
            schema.migrate(conn)
    finally:
        conn.close()
    message = str(caught.value)
    assert message.startswith(f"cannot migrate {db} from schema 1 to {schema.SCHEMA_VERSION}: "), (
        message
    )
    assert f"{db}.wal" in message and "rollback" not in message.lower(), message
    assert isinstance(caught.value.__cause__, duckdb.TransactionException)
    # nothing was half applied: the file is at version 1 still, and migrates later
    conn = open_read_only(db)
    try:
        assert schema.current_version(conn) == 1
    finally:
        conn.close()
    conn = open_db(db)
    try:
        assert schema.current_version(conn) == schema.SCHEMA_VERSION
    finally:
        conn.close()
