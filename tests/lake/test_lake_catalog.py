"""The lake's tables: made from the local schema, column for column, by racing writers."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import duckdb
import pytest

from tokentrace.store.errors import StoreError
from tokentrace.store.lake.catalog import ALIAS, attach, local_columns, open_lake
from tokentrace.store.schema import DATA_TABLES, check_version

pytestmark = pytest.mark.slow


def _attach_in_child(uri: str, data: str) -> None:
    conn = duckdb.connect()
    attach(conn, uri, data)
    conn.close()


def test_racing_writers_make_the_local_schemas_tables_once(lake: tuple[str, str]) -> None:
    uri, data = lake
    ctx = multiprocessing.get_context("spawn")
    children = [ctx.Process(target=_attach_in_child, args=(uri, data)) for _ in range(3)]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
    assert [c.exitcode for c in children] == [0, 0, 0]
    conn = open_lake(uri)
    try:
        rows = conn.execute(
            "SELECT table_name, column_name, data_type FROM duckdb_columns() "
            "WHERE database_name = ? ORDER BY table_name, column_index", [ALIAS]
        ).fetchall()
        lake_tables: dict[str, list[tuple[str, str]]] = {}
        for table, column, kind in rows:
            lake_tables.setdefault(table, []).append((column, kind))
        for table in DATA_TABLES:
            assert tuple(lake_tables[table]) == local_columns()[table], table
        assert set(lake_tables) == {*DATA_TABLES, "lake_moves", "schema_version"}
        assert check_version(conn, "the lake") == max(v for (v,) in conn.execute("SELECT version FROM schema_version").fetchall())
    finally:
        conn.close()


def test_an_unreachable_catalog_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"cannot attach the lake .*dbname=nowhere host=127\.0\.0\.1 port=1 "):
        open_lake("ducklake:postgres:dbname=nowhere host=127.0.0.1 port=1 password=secret", str(tmp_path))
    try:
        open_lake("ducklake:postgres:dbname=nowhere host=127.0.0.1 port=1 password=secret", str(tmp_path))
    except StoreError as exc:
        assert "secret" not in str(exc)
