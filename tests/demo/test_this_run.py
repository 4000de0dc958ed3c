"""`tokentrace demo --db FILE` appends to FILE: each scenario waits for and diagnoses only
this run's requests, not an earlier run's of the same service (no demo run needed: the
demo's own functions on a real DuckDB file written through the collector's writer)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from tokentrace.analyzer.report_cli import window_bounds
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.collector.writer import WriteBatch, Writer
from tokentrace.demo_cli import _diagnose, _wait_written
from tokentrace.store.connection import open_db

SERVICE = "tiny-llm-stutter"
S = 10**9
EARLIER_RUN_NS = 1_750_000_000 * S
THIS_RUN_NS = EARLIER_RUN_NS + 3600 * S  # an hour later


def _requests(start_ns: int, count: int, e2e_ms: float) -> list[RequestSummary]:
    return [
        RequestSummary(
            trace_id=f"{start_ns + i:032x}",
            request_id=f"req-{start_ns + i}",
            start_ns=start_ns + i * S // 10,
            e2e_ms=e2e_ms,
            queue_ms=1.0,
            prefill_ms=5.0,
            decode_ms=e2e_ms - 6.0,
            server_ms=e2e_ms,
            ttft_ms=6.0,
            prompt_tokens=20,
            output_tokens=16,
            model="tiny",
            service=SERVICE,
            source="tokentrace",
        )
        for i in range(count)
    ]


def _write(writer: Writer, requests: list[RequestSummary]) -> None:
    assert writer.submit_wait(WriteBatch(requests=requests))
    writer.flush()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[duckdb.DuckDBPyConnection, Writer]]:
    """A demo database that already holds an earlier run: 5 requests of the same service."""
    conn = open_db(tmp_path / "demo.duckdb")
    writer = Writer(conn)
    try:
        _write(writer, _requests(EARLIER_RUN_NS, 5, 900.0))
        yield conn, writer
    finally:
        writer.close()
        conn.close()


@pytest.mark.slow
def test_the_wait_does_not_count_an_earlier_runs_requests(
    store: tuple[duckdb.DuckDBPyConnection, Writer],
) -> None:
    conn, writer = store
    assert _wait_written(conn, SERVICE, 0, expected=5, timeout_s=0) == 5  # the earlier run's
    # nothing of this run yet: it waits (and says 0), not "5 already there"
    assert _wait_written(conn, SERVICE, THIS_RUN_NS, expected=3, timeout_s=0.3) == 0
    _write(writer, _requests(THIS_RUN_NS, 3, 100.0))
    assert _wait_written(conn, SERVICE, THIS_RUN_NS, expected=3, timeout_s=5.0) == 3


def test_the_diagnosis_reads_this_runs_requests_only(
    store: tuple[duckdb.DuckDBPyConnection, Writer],
) -> None:
    conn, writer = store
    _write(writer, _requests(THIS_RUN_NS, 3, 100.0))
    report = _diagnose(conn, SERVICE, THIS_RUN_NS)
    assert report["requests"]["count"] == 3
    # the earlier run's 900 ms requests are not this run's end-to-end time
    assert report["latency"]["e2e"]["p99"] < 200, report["latency"]["e2e"]


def test_the_printed_report_command_keeps_to_this_run() -> None:
    from tokentrace.demo_cli import since_option

    option = since_option(THIS_RUN_NS + 500_000_000)
    assert option == "--since 2025-06-15T16:06:40Z"
    start_ns, _ = window_bounds(option.removeprefix("--since "), None)
    assert EARLIER_RUN_NS < start_ns <= THIS_RUN_NS
