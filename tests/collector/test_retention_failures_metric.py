"""A `--retention` pass that fails is counted on /metrics
(`tokentrace_retention_failed_passes_total`), so an alert sees retention stalled
before the disk fills."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tt_testkit import start_serve

from tokentrace.store.connection import open_db

FAILED = "tokentrace_retention_failed_passes"
LAST_RUN = "tokentrace_retention_last_run_timestamp_seconds"
#: 2023-11-14: older than any retention the test asks for
OLD_NS = 1_700_000_000_000_000_000


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
