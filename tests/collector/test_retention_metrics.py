"""`--retention` in /metrics: rows deleted per table (a counter), when the last pass
completed (a gauge) and the passes that failed (a counter), so an alert sees retention
working or stalled before the disk fills."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from collector_testkit import LiveCollector, start_live
from otlp_traces import T0, new_id, request_trace, to_protobuf
from prometheus_client.parser import text_string_to_metric_families
from tt_testkit import start_serve

from tokentrace.collector.retention import TABLES
from tokentrace.store.connection import open_db

PB = {"Content-Type": "application/x-protobuf"}
DELETED = "tokentrace_retention_deleted"
LAST_RUN = "tokentrace_retention_last_run_timestamp_seconds"
FAILED = "tokentrace_retention_failed_passes"
#: 2023-11-14: older than any retention the test asks for
OLD_NS = 1_700_000_000_000_000_000


def _scrape(live: LiveCollector) -> dict[str, Any]:
    r = httpx.get(f"{live.http}/metrics")
    assert r.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def _post(live: LiveCollector, body: bytes) -> None:
    r = httpx.post(f"{live.http}/v1/traces", content=body, headers=PB)
    assert r.status_code == 200, r.text


@pytest.fixture
def with_retention(tmp_path: Path) -> Any:
    live, stop = start_live(tmp_path, retention="7d")
    try:
        yield live
    finally:
        stop()


def test_retention_passes_are_exported(with_retention: LiveCollector) -> None:
    live = with_retention
    retention = live.collector.retention
    assert retention is not None
    deadline = time.monotonic() + 30
    while retention.passes < 1 and time.monotonic() < deadline:  # the pass at start, on an empty store
        time.sleep(0.02)
    for i in range(2):  # two requests of November 2023: beyond any 7 days
        _post(live, to_protobuf(request_trace(new_id(16), start_ns=T0 + i)).SerializeToString())
    _post(live, to_protobuf(request_trace(new_id(16), start_ns=time.time_ns())).SerializeToString())
    live.settle()
    deleted_before = dict(retention.deleted_total)
    before = time.time()
    retention.run_pass()
    after = time.time()

    families = _scrape(live)
    counter = families[DELETED]
    assert counter.type == "counter"
    deleted = {s.labels["table"]: s.value for s in counter.samples if s.name == DELETED + "_total"}
    assert set(deleted) == {t.table for t in TABLES}
    assert deleted["requests"] == deleted_before["requests"] + 2
    assert deleted == {table: float(n) for table, n in retention.deleted_total.items()}
    gauge = families[LAST_RUN]
    assert gauge.type == "gauge"
    (last_run,) = gauge.samples
    assert before <= last_run.value <= after


def test_without_retention_there_are_no_retention_metrics(live: LiveCollector) -> None:
    families = _scrape(live)
    assert DELETED not in families and LAST_RUN not in families


def _store_refusing_deletes(db: Path) -> None:
    """Makes a store whose old GPU sample DuckDB will not delete: another table
    (a user's own, added beside the collector's) holds a foreign key to it."""
    conn = open_db(db)
    try:
        conn.execute(
            "INSERT INTO gpu_samples (service, instance, gpu_index, ts_ns) VALUES ('svc', 'i-1', 0, ?)",
            [OLD_NS],
        )
        conn.execute("ALTER TABLE gpu_samples ADD PRIMARY KEY (ts_ns)")
        conn.execute(
            "CREATE TABLE gpu_notes (ts_ns BIGINT REFERENCES gpu_samples (ts_ns), note VARCHAR)"
        )
        conn.execute("INSERT INTO gpu_notes VALUES (?, 'throttled')", [OLD_NS])
    finally:
        conn.close()


@pytest.mark.slow
def test_a_failed_retention_pass_is_counted_on_metrics(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    _store_refusing_deletes(db)
    serve = start_serve(tmp_path, "--retention", "7d", db=db)
    try:
        deadline = time.monotonic() + 30
        while True:  # the pass at start fails on gpu_samples
            r = httpx.get(f"{serve.otlp_http}/metrics")
            assert r.status_code == 200
            families = {f.name: f for f in text_string_to_metric_families(r.text)}
            failed = families[FAILED]
            if failed.samples[0].value >= 1 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert failed.type == "counter"
        ((name, labels, value, *_),) = failed.samples
        assert (name, labels, value) == (FAILED + "_total", {}, 1.0)
        assert not families[LAST_RUN].samples  # no pass has completed
    finally:
        out = serve.stop()
    assert "tokentrace retention: pass failed" in out and "foreign key" in out, out
    # the failed group was rolled back: the sample its note refers to is still there
    assert serve.rows("SELECT count(*) FROM gpu_samples") == [(1,)]
