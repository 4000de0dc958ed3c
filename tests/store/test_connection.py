"""Opening the DuckDB file for writing: settings reach DuckDB, bad ones fail clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokentrace.store.connection import StoreError, open_db


def _setting(conn, name: str) -> str:  # type: ignore[no-untyped-def]
    return str(conn.execute("SELECT current_setting(?)", [name]).fetchone()[0])


def test_checkpoint_threshold_and_memory_limit_reach_duckdb(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "a.duckdb", memory_limit="300MB", checkpoint_threshold="128MB")
    try:
        assert _setting(conn, "checkpoint_threshold").startswith("122.0 MiB")  # 128 MB in MiB
        assert _setting(conn, "memory_limit").startswith("286.1 MiB")
    finally:
        conn.close()


def test_a_bad_threshold_is_a_clear_error_and_creates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "b.duckdb"
    with pytest.raises(StoreError, match="checkpoint_threshold"):
        open_db(db, checkpoint_threshold="lots")
    assert not db.exists()
