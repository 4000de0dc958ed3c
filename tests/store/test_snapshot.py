"""`one_snapshot`: a reader's statements see one snapshot, in a DuckDB file and in a lake.

A writer commits between two statements of a reader; inside `one_snapshot` both see the
data as it was at the first, after it the next statement sees the write.  The lake's case
runs over a real DuckLake (PostgreSQL catalog, the `lake` fixture)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tokentrace.store.lake.catalog import ALIAS, attach, open_lake
from tokentrace.store.snapshot import one_snapshot

INSERT = "INSERT INTO {t} SELECT range FROM range(?, ? + 10)"


def _reads_one_snapshot(reader: duckdb.DuckDBPyConnection, write: callable, table: str) -> None:  # type: ignore[valid-type]
    count = f"SELECT count(*) FROM {table}"  # noqa: S608 - the test's own table
    write(0)
    with one_snapshot(reader):
        [(before,)] = reader.execute(count).fetchall()
        write(10)
        [(during,)] = reader.execute(count).fetchall()
    [(after,)] = reader.execute(count).fetchall()
    assert (before, during, after) == (10, 10, 20)


def test_a_file_readers_statements_see_one_snapshot(tmp_path: Path) -> None:
    conn = duckdb.connect(str(tmp_path / "f.duckdb"))
    conn.execute("CREATE TABLE t (x BIGINT)")
    writer, reader = conn.cursor(), conn.cursor()
    _reads_one_snapshot(reader, lambda at: writer.execute(INSERT.format(t="t"), [at, at]), "t")


@pytest.mark.slow
def test_a_lake_readers_statements_see_one_snapshot(lake: tuple[str, str]) -> None:
    uri, data = lake
    writer = duckdb.connect()
    attach(writer, uri, data)
    writer.execute(f"CREATE TABLE {ALIAS}.snap (x BIGINT)")
    reader = open_lake(uri, data)
    try:
        _reads_one_snapshot(
            reader, lambda at: writer.execute(INSERT.format(t=f"{ALIAS}.snap"), [at, at]), "snap"
        )
    finally:
        reader.close()
        writer.close()


def test_an_error_in_the_block_ends_the_transaction_and_is_raised(tmp_path: Path) -> None:
    conn = duckdb.connect(str(tmp_path / "f.duckdb"))
    with pytest.raises(duckdb.CatalogException), one_snapshot(conn):
        conn.execute("SELECT * FROM no_such_table")
    conn.execute("BEGIN TRANSACTION")  # none was left open
    conn.execute("COMMIT")
