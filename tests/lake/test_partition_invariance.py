"""Partition invariance (issue 23): the same traces sent to one collector, or split by trace
id (tests/lake/otlp_router.py, as the OpenTelemetry Collector's `loadbalancing` exporter
splits them) across four collectors, give the same request rows and the same top finding.

The traces are the engine recordings (tests/data/engines/: real vLLM, real instrumented
clients), each export posted as it was recorded, in order, to the one collector and through
the router to the four.  The sampler runs with its p99 never warm (`--p99-min-samples`
above the traffic) and every trace kept as a warm-up trace: which slow traces a shard keeps
rests on the p99 it sees, and docs/scale-out.md says where that differs; the rows, their
buckets and flags must not.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otlp_router import PB, OtlpRouter
from tt_testkit import REPO, ServeProcess, start_serve

pytestmark = [pytest.mark.slow, pytest.mark.alone]

RECORDINGS = REPO / "tests" / "data" / "engines"
#: every recording of real vLLM serving real clients, and its start-up trace (engine_starts)
RUNS = (
    "chat_openllmetry", "chat_openinference", "chat_openai_v2", "stutter", "tenants",
    "batch_events", "client_errors", "fanout", "vllm_startup",
)  # fmt: skip
SHARDS = 4
#: no p99 ever warm and every trace kept (see the module's docstring)
SAMPLING = ("--p99-min-samples", "100000", "--p99-warmup", "100000")
#: columns that say which process wrote a row, not what the row is
PER_PROCESS = {"commit_seq", "decided_ns"}
#: the data tables a comparison reads, with the columns that name one row of each
TABLES = {
    "requests": ("trace_id", "request_id"),
    "kept_traces": ("trace_id",),
    "spans": ("trace_id", "span_id"),
    "itl_hist": ("trace_id", "request_id"),
    "engine_starts": ("trace_id",),
    "unmatched_traces": ("trace_id",),
}


def recorded_exports() -> list[bytes]:
    """Gives every recorded export as OTLP/HTTP protobuf, in the order it was recorded."""
    bodies = []
    for name in RUNS:
        for line in (RECORDINGS / f"{name}.jsonl").read_text().splitlines():
            doc = json.loads(line)
            for span in _spans_and_links(doc):  # OTLP/JSON ids are hex, protobuf's JSON base64
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
            request = ExportTraceServiceRequest()
            json_format.ParseDict(doc, request)
            bodies.append(request.SerializeToString())
    return bodies


def _spans_and_links(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                yield span
                yield from span.get("links", [])


def post(server: ServeProcess, body: bytes) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", "/v1/traces", body=body, headers=PB)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def table_rows(conn: Any, table: str) -> dict[tuple[object, ...], dict[str, object]]:
    """Gives `table`'s rows by their key, less the per-process columns."""
    cursor = conn.execute(f"SELECT * FROM {table}")  # noqa: S608 - a name from TABLES
    columns = [d[0] for d in cursor.description]
    key = TABLES[table]
    rows: dict[tuple[object, ...], dict[str, object]] = {}
    for values in cursor.fetchall():
        row = {c: v for c, v in zip(columns, values, strict=True) if c not in PER_PROCESS}
        ident = tuple(row[k] for k in key)
        assert ident not in rows, f"{table} holds {ident} twice"
        rows[ident] = row
    return rows


def file_tables(db: Path) -> dict[str, dict[tuple[object, ...], dict[str, object]]]:
    from tokentrace.store.connection import open_read_only

    conn = open_read_only(db)
    try:
        return {table: table_rows(conn, table) for table in TABLES}
    finally:
        conn.close()


def lake_tables(uri: str) -> dict[str, dict[tuple[object, ...], dict[str, object]]]:
    from tokentrace.store.lake.catalog import open_lake

    conn = open_lake(uri)
    try:
        return {table: table_rows(conn, table) for table in TABLES}
    finally:
        conn.close()


def lake_request_count(uri: str) -> int:
    from tokentrace.store.lake.catalog import open_lake

    conn = open_lake(uri)
    try:
        return int(conn.execute("SELECT count(*) FROM requests").fetchone()[0])
    finally:
        conn.close()


def report_json(*where: str) -> dict[str, Any]:
    """Gives `tokentrace report --format json` over `where` (`--db FILE` or `--lake URI`)."""
    done = subprocess.run(
        [sys.executable, "-m", "tokentrace", "report", "--format", "json", *where],
        capture_output=True, text=True, timeout=300, env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def serve_in(folder: Path, *args: str) -> ServeProcess:
    """Starts `tokentrace serve` on a database in `folder` (made here)."""
    folder.mkdir()
    return start_serve(folder, *args)


def send_everywhere(one: ServeProcess, router: OtlpRouter, bodies: list[bytes]) -> None:
    """Posts each export to the one collector and through the router, in lockstep, so both
    sides see the same arrivals at nearly the same times."""
    for body in bodies:
        assert post(one, body) == 200
        assert router.route("/v1/traces", body) == 200


def assert_same_tables(
    one: dict[str, dict[tuple[object, ...], dict[str, object]]],
    many: dict[str, dict[tuple[object, ...], dict[str, object]]],
) -> None:
    for table in TABLES:
        assert one[table].keys() == many[table].keys(), table
        for key, row in one[table].items():
            assert many[table][key] == row, (table, key)
    assert len(one["requests"]) >= 100  # the recordings' requests, past the diagnosis' 30


def findings(report: dict[str, Any]) -> list[tuple[str, object]]:
    """Gives the report's findings, most important first, with their confidence."""
    return [(f["complaint"], f["confidence"]) for f in report["findings"]]


def test_four_collectors_on_their_own_files_store_what_one_stores(tmp_path: Path) -> None:
    """The collector's side alone (no lake): split by trace id, four files hold between them
    the rows one file holds."""
    one = serve_in(tmp_path / "one", *SAMPLING)
    shards = [serve_in(tmp_path / f"s{i}", *SAMPLING) for i in range(SHARDS)]
    router = OtlpRouter([s.otlp_http for s in shards])
    try:
        send_everywhere(one, router, recorded_exports())
    finally:
        for server in (one, *shards):
            server.stop()
    assert all(router.spans_sent), router.spans_sent  # every shard got its share
    many: dict[str, dict[tuple[object, ...], dict[str, object]]] = {t: {} for t in TABLES}
    for shard in shards:
        for table, rows in file_tables(shard.db).items():
            assert not rows.keys() & many[table].keys(), f"{table}: a trace on two shards"
            many[table].update(rows)
    assert_same_tables(file_tables(one.db), many)


def test_four_shards_writing_one_lake_give_the_same_rows_and_top_finding(
    tmp_path: Path, lake: tuple[str, str]
) -> None:
    uri, data = lake
    one = serve_in(tmp_path / "one", *SAMPLING)
    lake_args = ("--lake", uri, "--lake-data", data, "--lake-move-interval-s", "0.5")
    shards = [
        serve_in(tmp_path / f"s{i}", *SAMPLING, *lake_args, "--shard", f"s{i}")
        for i in range(SHARDS)
    ]
    router = OtlpRouter([s.otlp_http for s in shards])
    try:
        send_everywhere(one, router, recorded_exports())
    finally:
        one.stop()
    expected = file_tables(one.db)
    try:
        # the shards decide their last traces a grace after they end, and move them within
        # an interval: wait for the lake to hold every request the one collector stored
        deadline = time.monotonic() + 120
        while lake_request_count(uri) < len(expected["requests"]):
            assert time.monotonic() < deadline, "the lake never got every request"
            assert all(s.proc.poll() is None for s in shards), "a shard exited"
            time.sleep(0.5)
    finally:
        for shard in shards:
            shard.stop()
    assert_same_tables(expected, lake_tables(uri))
    from_file, from_lake = report_json("--db", str(one.db)), report_json("--lake", uri)
    assert findings(from_file)[0][0] == "stutter"  # what the recordings hold, first
    assert findings(from_lake) == findings(from_file)
    assert from_lake["requests"] == from_file["requests"]
