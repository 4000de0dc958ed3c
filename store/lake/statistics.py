"""What the lake's catalog knows of a table's values without opening a file: each column's
bounds, as DuckLake records them in `ducklake_table_column_stats` for the whole table.

The DuckLake specification makes them bounds, not figures: "This does not have to be exact but
has to be a lower bound" (and an upper one for the maximum).  DuckDB answers `min()` of an
integer column from them, but not of a DOUBLE (whether it holds a NaN is not recorded), so over
Parquet each `min()`/`max()` of a latency column is a scan: ~0.06 CPU-s at 10 M requests, 1.2
of a report's 12 (analyzer/report.py reads them instead where a covering range will do).
"""

from __future__ import annotations

import math

import duckdb

#: DuckLake's default name for the attached metadata catalog of lake `name` (ATTACH's
#: METADATA_CATALOG option; tokentrace never sets it).
METADATA_CATALOG = "__ducklake_metadata_{name}"


def column_bounds(
    conn: duckdb.DuckDBPyConnection, lake: str, table: str
) -> dict[str, tuple[float, float]]:
    """Gives, per column of `table` (in the current schema of lake `lake`) whose bounds the
    catalog records as finite numbers, its (lower, upper) bound: every value the table holds
    lies between them, by the DuckLake specification.  Read from the catalog as it is now: a
    later commit only widens them (a delete leaves them as they were).  {} where the lake's
    metadata catalog is not attached under DuckLake's default name: the bounds only spare a
    scan, which then ranges the columns as over a file."""
    meta = '"{}"'.format(METADATA_CATALOG.format(name=lake).replace('"', '""'))
    try:
        rows = conn.execute(
            f"""
            SELECT c.column_name, s.min_value, s.max_value
            FROM {meta}.ducklake_table_column_stats s
            JOIN {meta}.ducklake_table t ON t.table_id = s.table_id AND t.end_snapshot IS NULL
            JOIN {meta}.ducklake_schema h
                ON h.schema_id = t.schema_id AND h.end_snapshot IS NULL
            JOIN {meta}.ducklake_column c
                ON c.table_id = s.table_id AND c.column_id = s.column_id
                AND c.end_snapshot IS NULL
            WHERE t.table_name = ? AND h.schema_name = current_schema()
            """,  # noqa: S608 - the catalog's name is DuckLake's for the lake, quoted
            [table],
        ).fetchall()
    except (duckdb.CatalogException, duckdb.BinderException):
        # not attached under that name (DuckDB lists the default one nowhere, so this is the
        # test), or laid out otherwise than DuckLake 1.5.5's
        return {}
    bounds: dict[str, tuple[float, float]] = {}
    for column, low, high in rows:
        try:
            lo, hi = float(low), float(high)
        except (TypeError, ValueError):  # not recorded, or not a number
            continue
        if math.isfinite(lo) and math.isfinite(hi) and lo <= hi:
            bounds[column] = (lo, hi)
    return bounds
