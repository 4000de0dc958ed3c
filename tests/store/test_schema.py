"""Schema migrations on a real DuckDB file: fresh files and files an older tokentrace wrote."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tokentrace.store import schema
from tokentrace.store.connection import open_db


def _indexes(path: Path) -> set[str]:
    conn = duckdb.connect(str(path), read_only=True)
    try:
        return {row[0] for row in conn.execute("SELECT index_name FROM duckdb_indexes()").fetchall()}
    finally:
        conn.close()


def test_a_fresh_file_gets_every_table_and_no_requests_index(tmp_path: Path) -> None:
    db = tmp_path / "fresh.duckdb"
    open_db(db).close()
    assert _indexes(db) == {"spans_trace", "kept_trace"}
    conn = duckdb.connect(str(db), read_only=True)
    try:
        versions = [row[0] for row in conn.execute("SELECT version FROM schema_version ORDER BY 1").fetchall()]
    finally:
        conn.close()
    assert versions == list(range(1, schema.SCHEMA_VERSION + 1))


def test_a_version_1_file_keeps_its_rows_and_loses_the_requests_index(tmp_path: Path) -> None:
    db = tmp_path / "v1.duckdb"
    conn = duckdb.connect(str(db))
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL, applied_at TIMESTAMP NOT NULL)")
    for statement in schema._MIGRATIONS[1]:
        conn.execute(statement)
    conn.execute("INSERT INTO schema_version VALUES (1, now())")
    conn.execute("INSERT INTO kept_traces (trace_id, reason, weight, decided_ns, span_count) VALUES ('t1', 'error', 1.0, 1, 3)")
    conn.close()
    assert "requests_trace" in _indexes(db)
    conn = open_db(db)
    try:
        assert schema.current_version(conn) == schema.SCHEMA_VERSION
        assert conn.execute("SELECT trace_id, reason FROM kept_traces").fetchall() == [("t1", "error")]
    finally:
        conn.close()
    assert _indexes(db) == {"spans_trace", "kept_trace"}


def test_a_version_2_file_keeps_its_steps_and_gains_forward_host_us(tmp_path: Path) -> None:
    db = tmp_path / "v2.duckdb"
    conn = duckdb.connect(str(db))
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL, applied_at TIMESTAMP NOT NULL)")
    for version in (1, 2):
        for statement in schema._MIGRATIONS[version]:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_version VALUES (?, now())", [version])
    conn.execute("INSERT INTO engine_steps VALUES ('svc', 'i', 1, 2, 3, 4, 5, 6, 0.5, 700, ['r1'])")
    conn.close()
    conn = open_db(db)
    try:
        assert conn.execute("SELECT gpu_us, forward_host_us, request_ids FROM engine_steps").fetchall() == [
            (700, None, ["r1"])
        ]
    finally:
        conn.close()


def test_a_newer_file_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "new.duckdb"
    open_db(db).close()
    conn = duckdb.connect(str(db))
    conn.execute("INSERT INTO schema_version VALUES (?, now())", [schema.SCHEMA_VERSION + 1])
    conn.close()
    with pytest.raises(RuntimeError, match="newer than this tokentrace"):
        open_db(db)
