"""`tokentrace requests`: one row per request (docs/design.md §6) as JSONL, CSV or Parquet."""

from __future__ import annotations

import json
import sys
from typing import IO, Any

import duckdb

from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.summary import COLUMNS

FORMATS = ("jsonl", "csv", "parquet")
#: Millisecond columns are written to the microsecond in CSV and JSON lines: the sums
#: behind them leave float noise (23.891000000000002) that no clock measured.
MS_DECIMALS = 3
_MS_SCALE = 10**MS_DECIMALS
_NS_PER_MS = 10**6
#: nanoseconds in the last decimal written (the microsecond)
_NS_PER_DECIMAL = _NS_PER_MS // _MS_SCALE
#: `start` in CSV and JSON lines: ISO 8601, UTC, microseconds, `Z`.
START_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
#: `start` in Parquet (and the Arrow table): microseconds since the epoch, marked UTC
#: (Parquet `isAdjustedToUTC`, DuckDB TIMESTAMPTZ), so Polars, pyarrow and DuckDB
#: read it back as a UTC instant rather than a wall-clock time of no zone.
START_ARROW_TYPE = ("us", "UTC")


def _is_ms(name: str) -> bool:
    return name.endswith("_ms")


def _round_ms(v: float) -> float:
    """Rounds to the microsecond (half to even) the way `_for_text` does in Arrow, so a
    value reads the same in CSV and in JSON lines: 23.891000000000002 → 23.891.

    The figures are whole nanoseconds over 1e6: first back to the nanosecond, so a tie
    is decided on the exact decimal (32640500 ns → 32.640 ms), not on the double that
    holds it (32.640500000000004 → 32.641)."""
    return round(round(v * _NS_PER_MS) / _NS_PER_DECIMAL) / _MS_SCALE


def requests_table(conn: duckdb.DuckDBPyConnection, filters: Filters, limit: int | None = None) -> Any:
    """Gives the filtered requests as an Arrow table, oldest first (requests that start at one
    nanosecond by trace and request id: the same order every time), with `start` a UTC
    timestamp."""
    where, params = filters.where()
    cols = ", ".join(c if c != "start_ns" else "start_ns, make_timestamp(start_ns // 1000) AS start" for c in COLUMNS)
    sql = f"SELECT {cols} FROM requests {where} ORDER BY start_ns, trace_id, request_id"  # noqa: S608 - fixed column names, bound values
    if limit is not None:
        sql += " LIMIT ?"
        params = [*params, int(limit)]
    # the relation API hands Arrow over without the DB-API's extra copy
    return _start_in_utc(conn.sql(sql, params=params).to_arrow_table())


def _start_in_utc(table: Any) -> Any:
    """Gives `table` with `start` marked UTC.  DuckDB's TIMESTAMP arrives zone-less; its
    microseconds are since the UTC epoch (`make_timestamp` of `start_ns`), so the cast only
    labels them.  Done in Arrow, not as a TIMESTAMPTZ in SQL: DuckDB would hand that over
    in the connection's TimeZone setting, not in UTC."""
    import pyarrow as pa

    utc = pa.timestamp(*START_ARROW_TYPE)
    i = table.schema.get_field_index("start")
    return table.set_column(i, pa.field("start", utc), table.column(i).cast(utc))


def write_requests(
    conn: duckdb.DuckDBPyConnection,
    filters: Filters,
    fmt: str,
    out: IO[bytes] | None = None,
    limit: int | None = None,
) -> int:
    """Writes the requests to `out` (stdout by default); gives the row count."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, not {fmt!r}")
    table = requests_table(conn, filters, limit)
    out = out or sys.stdout.buffer
    if fmt == "jsonl":
        ms_cols = [name for name in table.column_names if _is_ms(name)]
        for row in _start_as_utc_clock(table).to_pylist():
            row["start"] = row["start"].strftime(START_FORMAT) if row["start"] is not None else None
            for name in ms_cols:
                if row[name] is not None:
                    row[name] = _round_ms(row[name])
            out.write(json.dumps(row, default=str).encode() + b"\n")
    elif fmt == "csv":
        import pyarrow as pa
        import pyarrow.csv as pacsv

        # CSV has no lists: flags become a ;-joined string
        idx = table.schema.get_field_index("flags")
        flags = pa.array([";".join(f or []) for f in table.column("flags").to_pylist()])
        table = table.set_column(idx, "flags", flags)
        pacsv.write_csv(_inert_for_spreadsheets(_for_text(table)), out)
    else:
        import pyarrow.parquet as pq

        pq.write_table(table, out)
    out.flush()
    return table.num_rows


def _for_text(table: Any) -> Any:
    """Gives `table` as text formats write it: millisecond columns rounded to the
    microsecond, `start` as ISO 8601 UTC text ending in `Z` (as JSON lines write it)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for i, field in enumerate(table.schema):
        if _is_ms(field.name) and pa.types.is_floating(field.type):
            # scale, round, scale back: the quotient is the double nearest the decimal
            # (pyarrow's round(x, 3) leaves 23.891000000000002 as it was); to the
            # nanosecond first, as `_round_ms` (half to even on the exact decimal)
            ns = pc.round(pc.multiply(table.column(i), float(_NS_PER_MS)))
            scaled = pc.round(pc.divide(ns, float(_NS_PER_DECIMAL)), round_mode="half_to_even")
            table = table.set_column(i, field, pc.divide(scaled, float(_MS_SCALE)))
        elif field.name == "start" and pa.types.is_timestamp(field.type):
            # the zone-less UTC clock reading (as `_start_as_utc_clock`): no zone to look up
            clock = table.column(i).cast(pa.timestamp(field.type.unit))
            start = pc.strftime(clock, format=START_FORMAT.replace(".%f", ""))
            # strftime's %S gives the fraction at the column's unit (µs); Z after it
            table = table.set_column(i, pa.field("start", pa.string()), start)
    return table


def _start_as_utc_clock(table: Any) -> Any:
    """Gives `table` with `start` as the zone-less UTC clock reading the text formats write
    (with their `Z`): formatting it then needs no time-zone database, in Arrow or Python."""
    import pyarrow as pa

    i = table.schema.get_field_index("start")
    clock = pa.timestamp(START_ARROW_TYPE[0])
    return table.set_column(i, pa.field("start", clock), table.column(i).cast(clock))


#: A text cell a spreadsheet would run as a formula (OWASP "CSV injection").
FORMULA_START = r"^([=+\-@\t\r])"


def _inert_for_spreadsheets(table: Any) -> Any:
    """Gives `table` with every text cell that starts like a formula (`=`, `+`, `-`,
    `@`, tab, CR) prefixed by `'`: model, tenant and request ids come from spans,
    and `=HYPERLINK(...)` as a model name must not become a live formula when the
    CSV is opened in Excel or LibreOffice.  Numbers are not text: untouched."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for i, field in enumerate(table.schema):
        if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
            inert = pc.replace_substring_regex(table.column(i), pattern=FORMULA_START, replacement="'\\1")
            table = table.set_column(i, field, inert)
    return table
