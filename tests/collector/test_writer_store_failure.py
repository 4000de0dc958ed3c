"""A store that refuses writes (a full disk) costs no accepted row: the writer
keeps the batches and retries them, receivers answer 503 instead of 200, /readyz
says why, and a failing ROLLBACK does not hide the original error.

A real full disk needs a root mount (tmpfs), so the failure is injected at the
DuckDB layer: the writer's connection raises DuckDB's own "No space left on
device" IOException for its INSERTs, after ending the transaction the way DuckDB
does (so the writer's ROLLBACK fails with "no transaction is active", as seen on
a full tmpfs)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from otlp_traces import request_trace, to_protobuf

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.collector.writer import WriteBatch, Writer
from tokentrace.store.connection import open_db

pytestmark = pytest.mark.slow

PB = {"Content-Type": "application/x-protobuf"}
ENOSPC = "IO Error: Could not write file \"live.duckdb.wal\": No space left on device"


class FullDisk:
    """The writer's connection, but its INSERTs fail while `full` is set (or
    for the next `fail_next` INSERTs) the way DuckDB fails on a full disk."""

    def __init__(self, conn: duckdb.DuckDBPyConnection) -> None:
        self._conn = conn
        self.full = threading.Event()
        self.fail_next = 0
        self.failed = 0

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith("INSERT") and (self.full.is_set() or self.fail_next > 0):
            self.fail_next = max(0, self.fail_next - 1)
            self.failed += 1
            self._conn.execute("ROLLBACK")  # DuckDB ends the failed transaction itself
            raise duckdb.IOException(ENOSPC)
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _readyz(base: str) -> httpx.Response:
    return httpx.get(f"{base}/readyz", timeout=5)


def _metric(base: str, name: str) -> float:
    for line in httpx.get(f"{base}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not exported")


def test_full_disk_answers_503_and_loses_nothing_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from collector_testkit import start_live

    caplog.set_level(logging.INFO, logger="tokentrace.collector")
    live, stop = start_live(
        tmp_path, grace_s=0.05, baseline=1.0, max_pending_writes=4, max_buffered_spans=600
    )
    try:
        writer = live.collector.writer
        disk = FullDisk(writer._conn)
        monkeypatch.setattr(writer, "_conn", disk)
        bisected: list[int] = []
        real_bisect = writer._bisect
        monkeypatch.setattr(
            writer, "_bisect", lambda pieces, *a: (bisected.append(len(pieces)), real_bisect(pieces, *a))
        )
        assert _readyz(live.http).json() == {"status": "ready"}

        accepted: set[str] = set()
        codes: list[int] = []

        def post(n: int) -> None:
            with httpx.Client(timeout=10) as client:
                for _ in range(n):
                    spans = request_trace()
                    r = client.post(f"{live.http}/v1/traces", headers=PB,
                                    content=to_protobuf(spans).SerializeToString())  # fmt: skip
                    codes.append(r.status_code)
                    if r.status_code == 200:
                        accepted.add(spans[0].trace_id)
                    else:
                        assert r.status_code == 503, r.text
                        assert r.headers["Retry-After"] == "1"

        post(20)  # written normally
        disk.full.set()
        # the disk is full: exports keep coming until the writer's queue is full
        # and the refusals start
        deadline = time.monotonic() + 20
        while codes.count(503) < 20 and time.monotonic() < deadline:
            post(10)
            time.sleep(0.05)
        assert codes.count(503) >= 20, codes  # 503s, not 200s for rows that cannot be written
        assert disk.failed > 0
        refused = httpx.post(f"{live.http}/v1/traces", headers=PB,
                             content=to_protobuf(request_trace()).SerializeToString())  # fmt: skip
        assert refused.status_code == 503
        ready = _readyz(live.http)
        assert ready.status_code == 503
        assert ready.json()["status"] == "unavailable"
        assert "No space left on device" in ready.json()["reason"]
        assert _metric(live.http, "tokentrace_store_writable") == 0.0
        # the store being down is no reason to drop a single row
        assert writer.write_errors == 0
        accepted_while_full = len(accepted)

        disk.full.clear()  # space again
        deadline = time.monotonic() + 30
        while _readyz(live.http).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _readyz(live.http).json() == {"status": "ready"}
        post(10)  # taken again
        assert len(accepted) == accepted_while_full + 10

        stored = {r[0] for r in live.rows("SELECT trace_id FROM requests")}
        assert stored == accepted  # every request answered 200 is there, once
        assert live.rows("SELECT count(*) FROM requests") == [(len(accepted),)]
        assert writer.write_errors == 0
        assert bisected == []  # a full disk is no bad row: nothing retried one by one
        assert _metric(live.http, "tokentrace_store_writable") == 1.0
        assert _metric(live.http, "tokentrace_store_seconds_since_write") < 30
        log = caplog.text
        assert "No space left on device" in log
        assert "takes writes again" in log
        assert "would not take" not in log
        assert "retrying them apart" not in log
    finally:
        stop()


def test_a_failing_rollback_keeps_the_original_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tokentrace.collector")
    conn = open_db(tmp_path / "w.duckdb")
    writer = Writer(conn)
    disk = FullDisk(conn)
    writer._conn = disk  # type: ignore[assignment]
    try:
        rows = summarize_trace(request_trace(service="kept")).requests
        disk.fail_next = 1
        # the write's own error comes out, not ROLLBACK's "no transaction is active"
        with pytest.raises(duckdb.IOException, match="No space left on device"):
            writer._write([WriteBatch(requests=rows)])
        assert "cannot rollback" in caplog.text  # both are logged ...
        assert "No space left on device" in caplog.text  # ... the original as the cause
        assert "direct cause" in caplog.text

        # through the writer thread: kept, retried, written once the store takes it
        disk.fail_next = 2
        assert writer.submit(WriteBatch(requests=rows))
        writer.flush(timeout=20)
        assert conn.execute("SELECT service FROM requests").fetchall() == [("kept",)]
        assert writer.write_errors == 0
        assert writer.store_writable
    finally:
        writer.close()
        conn.close()
