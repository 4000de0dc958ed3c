"""`tokentrace requests` (and the explorer's `/api/requests.*`): `start` says it is UTC in every format."""

from __future__ import annotations

import csv
import io
import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokentrace.analyzer.export import write_requests
from tokentrace.analyzer.filters import Filters
from tokentrace.store.connection import open_db

from . import workloads
from .requests_rows import insert_requests

UTC_MICROS = pa.timestamp("us", tz="UTC")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _export(conn: duckdb.DuckDBPyConnection, fmt: str, limit: int | None = 50) -> bytes:
    out = io.BytesIO()
    write_requests(conn, Filters(), fmt, out, limit=limit)
    return out.getvalue()


@pytest.mark.parametrize("session_zone", ["UTC", "Asia/Kolkata"])
def test_parquet_start_is_a_utc_timestamp_every_reader_reads_as_utc(write_workload, session_zone: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    conn = write_workload(workloads.healthy())
    # the reading connection's own zone (DuckDB's TimeZone setting) must not shift or label it
    conn.execute("SET TimeZone = ?", [session_zone])
    start_ns = [r[0] for r in conn.execute("SELECT start_ns FROM requests ORDER BY start_ns LIMIT 50").fetchall()]
    expected = [EPOCH + timedelta(microseconds=ns // 1000) for ns in start_ns]  # exact, no float seconds
    data = _export(conn, "parquet")
    path = tmp_path / "requests.parquet"  # DuckDB reads Parquet from a file
    path.write_bytes(data)

    table = pq.read_table(io.BytesIO(data))
    assert table.schema.field("start").type == UTC_MICROS  # Parquet: isAdjustedToUTC, not a naive wall clock
    assert table.column("start").to_pylist() == expected

    frame = pl.read_parquet(io.BytesIO(data))
    assert frame.schema["start"] == pl.Datetime("us", "UTC")
    assert frame["start"].dt.epoch("us").to_list() == [ns // 1000 for ns in start_ns]
    assert frame["start"].to_list() == expected

    reader = duckdb.connect()
    try:
        reader.execute("SET TimeZone = 'UTC'")
        reader.execute("CREATE TABLE r AS SELECT * FROM read_parquet(?)", [str(path)])
        (kind,) = reader.execute("SELECT typeof(start) FROM r LIMIT 1").fetchone()  # type: ignore[misc]
        assert kind == "TIMESTAMP WITH TIME ZONE"
        assert [r[0] for r in reader.execute("SELECT epoch_us(start) FROM r ORDER BY start").fetchall()] == [
            ns // 1000 for ns in start_ns
        ]
    finally:
        reader.close()


def test_text_formats_write_the_same_utc_instant_with_z(write_workload) -> None:  # type: ignore[no-untyped-def]
    conn = write_workload(workloads.healthy())
    conn.execute("SET TimeZone = 'America/New_York'")
    parquet = pq.read_table(io.BytesIO(_export(conn, "parquet"))).column("start").to_pylist()
    lines = [json.loads(x)["start"] for x in _export(conn, "jsonl").decode().splitlines()]
    cells = [r["start"] for r in csv.DictReader(io.StringIO(_export(conn, "csv").decode()))]
    iso = [t.strftime("%Y-%m-%dT%H:%M:%S.%fZ") for t in parquet]
    assert lines == cells == iso
    # ISO 8601 with Z reads back as the same UTC instant
    assert [datetime.fromisoformat(x) for x in lines] == parquet


def test_an_empty_export_keeps_the_utc_type(write_workload) -> None:  # type: ignore[no-untyped-def]
    conn = write_workload(workloads.healthy())
    out = io.BytesIO()
    assert write_requests(conn, Filters(model="no such model"), "parquet", out) == 0
    assert pq.read_table(io.BytesIO(out.getvalue())).schema.field("start").type == UTC_MICROS


def test_a_tie_at_the_microsecond_rounds_half_to_even_on_the_exact_decimal(write_workload) -> None:  # type: ignore[no-untyped-def]
    # 32 640 500 ns is 32.6405 ms, held as the double 32.640500000000004: rounded as that
    # double it read 32.641; half to even on the decimal it is 32.640 (and 1.0015 -> 1.002)
    w = workloads.healthy()
    for r in w.requests:
        r.network_ms, r.queue_ms = 32640500 / 1e6, 1001500 / 1e6
    conn = write_workload(w)
    assert conn.execute("SELECT any_value(network_ms) * 1000 FROM requests").fetchall()[0][0] > 32640.5
    lines = [json.loads(x) for x in _export(conn, "jsonl").decode().splitlines()]
    cells = list(csv.DictReader(io.StringIO(_export(conn, "csv").decode())))
    assert {r["network_ms"] for r in lines} == {32.64} and {r["queue_ms"] for r in lines} == {1.002}
    assert {float(r["network_ms"]) for r in cells} == {32.64}
    assert {float(r["queue_ms"]) for r in cells} == {1.002}


def test_requests_that_start_together_come_in_one_order_in_every_format(tmp_path: Path) -> None:
    """Ties at a nanosecond (requests of one batch, or a client's clock) are ordered by trace
    and request id: an export reads the same twice, and in every format."""
    conn = open_db(tmp_path / "t.duckdb")
    rng = random.Random(3)
    n = 3000
    insert_requests(
        conn,
        {
            "trace_id": [f"{rng.getrandbits(128):032x}" for _ in range(n)],
            "request_id": [f"r{rng.randrange(5)}" for _ in range(n)],
            "start_ns": [1_767_225_600 * 10**9 + i % 3 for i in range(n)],
        },
    )
    expected = [
        list(r)
        for r in conn.execute(
            "SELECT trace_id, request_id FROM requests ORDER BY start_ns, trace_id, request_id"
        ).fetchall()
    ]
    stored = conn.execute("SELECT trace_id, request_id FROM requests").fetchall()
    assert expected != [list(r) for r in stored]  # the ties are not already in that order
    lines = [json.loads(x) for x in _export(conn, "jsonl", limit=None).decode().splitlines()]
    assert [[r["trace_id"], r["request_id"]] for r in lines] == expected
    cells = csv.DictReader(io.StringIO(_export(conn, "csv", limit=None).decode()))
    assert [[r["trace_id"], r["request_id"]] for r in cells] == expected
    table = pq.read_table(io.BytesIO(_export(conn, "parquet", limit=None)))
    columns = table.select(["trace_id", "request_id"]).to_pydict().values()
    assert [list(r) for r in zip(*columns, strict=True)] == expected
    conn.close()
