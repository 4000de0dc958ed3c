"""store/lake/statistics.py on a real DuckLake (a DuckDB file as its catalog: no server)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tokentrace.store.errors import StoreError
from tokentrace.store.lake.extensions import load_lake_extensions
from tokentrace.store.lake.statistics import column_bounds


def _lake(tmp_path: Path, options: str = "") -> duckdb.DuckDBPyConnection:
    conn = duckdb.connect()
    try:
        load_lake_extensions(conn)
    except StoreError as exc:
        pytest.skip(f"no ducklake extension: {exc}")
    conn.execute(
        f"ATTACH 'ducklake:{tmp_path / 'meta.ducklake'}' AS lake "
        f"(DATA_PATH '{tmp_path / 'data'}'{options})"
    )
    conn.execute("USE lake")
    conn.execute("CREATE TABLE requests (e2e_ms DOUBLE, output_tokens BIGINT, model VARCHAR)")
    conn.execute("INSERT INTO requests VALUES (12.5, 3, 'a'), (480.0, 40, 'b'), (NULL, 7, NULL)")
    return conn


def test_the_catalog_bounds_hold_every_value_of_each_numeric_column(tmp_path: Path) -> None:
    conn = _lake(tmp_path)
    try:
        bounds = column_bounds(conn, "lake", "requests")
    finally:
        conn.close()
    assert bounds["e2e_ms"][0] <= 12.5 and 480.0 <= bounds["e2e_ms"][1]
    assert bounds["output_tokens"][0] <= 3 and 40 <= bounds["output_tokens"][1]
    assert "model" not in bounds  # not a number


def test_a_metadata_catalog_under_another_name_gives_no_bounds_not_an_error(
    tmp_path: Path,
) -> None:
    conn = _lake(tmp_path, ", METADATA_CATALOG 'elsewhere'")
    try:
        conn.execute("BEGIN")  # a report reads in one transaction (store/snapshot.py)
        assert column_bounds(conn, "lake", "requests") == {}
        # the look-up that failed leaves the report's transaction usable
        assert conn.execute("SELECT count(*) FROM requests").fetchone() == (3,)
        conn.execute("COMMIT")
    finally:
        conn.close()
