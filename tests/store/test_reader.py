"""The store's reader: cursors over the writer's connection, or over the file read-only."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tokentrace.store.connection import StoreError, open_db
from tokentrace.store.reader import StoreReader

ROW = "INSERT INTO gpu_samples (service, instance, gpu_index, ts_ns) VALUES (?, 'i', 0, 1)"


def test_a_reader_made_before_the_file_opens_it_read_only_on_the_first_read(tmp_path: Path) -> None:
    db = tmp_path / "later.duckdb"
    reader = StoreReader(db)  # the explorer starts before the first import wrote the file
    try:
        with pytest.raises(StoreError, match="no tokentrace database"):
            with reader.cursor():
                pass
        conn = open_db(db)
        conn.execute(ROW, ["first"])
        conn.close()
        with reader.cursor() as cur:
            assert cur.execute("SELECT service FROM gpu_samples").fetchall() == [("first",)]
            with pytest.raises(duckdb.InvalidInputException, match="read-only"):
                cur.execute(ROW, ["written through a reader"])
    finally:
        reader.close()
    # closed: the file takes a writer again
    open_db(db).close()


def test_a_reader_over_the_writers_connection_sees_its_rows_and_leaves_it_open(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "served.duckdb")
    try:
        reader = StoreReader(tmp_path / "served.duckdb", conn)
        conn.execute(ROW, ["written"])
        with reader.cursor() as cur:
            assert cur.execute("SELECT service FROM gpu_samples").fetchall() == [("written",)]
        reader.close()
        # the connection is its owner's (the collector's), still open after the reader's close
        assert conn.execute("SELECT count(*) FROM gpu_samples").fetchone() == (1,)
    finally:
        conn.close()


def test_each_read_gets_its_own_cursor_closed_afterwards(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "cursors.duckdb")
    try:
        reader = StoreReader(tmp_path / "cursors.duckdb", conn)
        with reader.cursor() as first, reader.cursor() as second:
            assert first is not second and first is not conn
        with pytest.raises(duckdb.ConnectionException):
            first.execute("SELECT 1")
    finally:
        conn.close()
