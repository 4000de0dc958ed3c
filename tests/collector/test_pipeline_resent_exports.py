"""Exports sent again beyond the decision cache's reach: the same file imported twice,
a retried export reaching a new `serve` process, a trace the cache forgot, and a copy
that comes while its first copy's round is deciding it.  Each request is stored once,
each span of a kept trace once; the first copy written wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from collector_testkit import start_live
from otlp_traces import request_trace, to_json, to_protobuf

from tokentrace.analyzer.spans import Span
from tokentrace.collector.sampling import P99Tracker, Sampler
from tokentrace.store.connection import open_read_only

PB = {"Content-Type": "application/x-protobuf"}
TABLES = ("requests", "itl_hist", "spans", "kept_traces")


def _counts(query: Any) -> dict[str, int]:
    """Rows per table; `query(sql)` gives a result (`fetchall()`) or its rows."""
    counts = {}
    for table in TABLES:
        result = query(f"SELECT count(*) FROM {table}")  # noqa: S608 - fixed names
        counts[table] = (result if isinstance(result, list) else result.fetchall())[0][0]
    return counts


def _tokentrace(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENTRACE_")}
    out = subprocess.run(
        [sys.executable, "-m", "tokentrace", *args], capture_output=True, text=True, timeout=300, env=env
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.slow
def test_importing_a_file_twice_stores_what_importing_it_once_does(tmp_path: Path) -> None:
    traces = [request_trace() for _ in range(30)] + [request_trace(error=True) for _ in range(3)]
    traces.append(request_trace(attributes={"tokentrace.request.id": ""}))  # matched by its start
    path = tmp_path / "exported.json"
    path.write_text(json.dumps(to_json([s for t in traces for s in t])))
    db = tmp_path / "t.duckdb"
    counts, reports, said = [], [], []
    for _ in range(2):
        said.append(_tokentrace("import", str(path), "--db", str(db)))
        conn = open_read_only(db)
        try:
            counts.append(_counts(conn.sql))
        finally:
            conn.close()
        reports.append(
            json.loads(_tokentrace("report", "--db", str(db), "--format", "json"))["requests"]
        )
    assert counts[0]["requests"] == 34 and counts[0]["spans"] > 0
    assert counts[1] == counts[0]
    assert reports[1]["count"] == reports[0]["count"] == 34
    # the second import says it stored nothing new, not that it kept traces whole again
    assert "in the database already" not in said[0]
    assert "nothing new was stored (34 requests, in the database already" in said[1], said[1]
    assert "kept whole" not in said[1]


def _post(url: str, spans: list[Span]) -> None:
    r = httpx.post(
        f"{url}/v1/traces", content=to_protobuf(spans).SerializeToString(), headers=PB, timeout=60
    )
    assert r.status_code == 200, r.text


@pytest.mark.slow
def test_a_retry_that_reaches_a_new_serve_process_is_stored_once(tmp_path: Path) -> None:
    # the collector restarted between the export it took and the exporter's retry
    kept, dropped = request_trace(error=True), request_trace()
    for _ in range(2):
        live, stop = start_live(tmp_path)
        try:
            _post(live.http, kept + dropped)
            live.settle()
            counts = _counts(live.rows)
            stats = live.collector.pipeline.stats
            metrics = httpx.get(f"{live.http}/metrics").text
        finally:
            stop()
        assert counts == {"requests": 2, "itl_hist": 2, "spans": 6, "kept_traces": 1}
    # the second process: both traces started before its store's latest row
    assert stats.traces_rechecked == 2
    assert live.collector.writer.requests_already_stored == 2
    assert live.collector.writer.spans_already_stored == 6
    # and an operator sees them on /metrics
    assert "tokentrace_requests_already_stored_total 2.0" in metrics
    assert "tokentrace_spans_already_stored_total 6.0" in metrics


def test_a_trace_the_decision_cache_forgot_is_not_summarized_again(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(decision_cache_size=2)
    kept, dropped = request_trace(error=True), request_trace()
    first = kept + dropped
    rig.pipeline.add(first)
    rig.clock.advance(1.5)
    rig.pipeline.decide_ready()
    for _ in range(3):  # newer traces push both out of the cache
        rig.pipeline.add(request_trace(start_ns=kept[0].start_ns + 60_000_000_000))
        rig.clock.advance(1.5)
        rig.pipeline.decide_ready()
    assert rig.pipeline.is_decided(kept[0].trace_id) is None
    late = Span(kept[0].trace_id, "00000000000000aa", kept[-1].span_id, "tool.call", 1,
                kept[0].start_ns, kept[0].end_ns, {}, kept[0].resource)  # fmt: skip
    rig.pipeline.add([*first, late])  # the retry, with a span the kept trace lacked
    rig.clock.advance(1.5)
    rig.pipeline.decide_ready()
    trace = [kept[0].trace_id]
    assert rig.rows("SELECT count(*) FROM requests WHERE trace_id = ?", trace) == [(1,)]
    assert rig.rows("SELECT count(*) FROM requests WHERE trace_id = ?", [dropped[0].trace_id]) == [
        (1,)
    ]
    assert rig.rows(
        "SELECT count(*), count(DISTINCT span_id) FROM spans WHERE trace_id = ?", trace
    ) == [(7, 7)]
    assert rig.rows("SELECT count(*) FROM kept_traces WHERE trace_id = ?", trace) == [(1,)]
    assert rig.rows("SELECT count(*) FROM spans WHERE trace_id = ?", [dropped[0].trace_id]) == [
        (0,)
    ]
    assert rig.rows("SELECT count(*) FROM itl_hist") == [(5,)]
    assert rig.pipeline.stats.traces_rechecked == 2


class _ResendingSampler(Sampler):
    """Re-offers each trace once while its round decides it: the exporter's retry that
    comes after the decider took the trace from the buffer, before it cached its decision."""

    def __init__(self) -> None:
        super().__init__(baseline=0.0, p99=P99Tracker(warmup=0))
        self.pipeline: Any = None
        self.resent: set[str] = set()

    def decide(self, trace_id: str, spans: Any, requests: Any, **kw: Any) -> Any:
        if trace_id not in self.resent:
            self.resent.add(trace_id)
            assert self.pipeline.add(list(spans))
        return super().decide(trace_id, spans, requests, **kw)


def test_a_copy_that_comes_while_its_round_decides_follows_that_decision(make_rig) -> None:  # type: ignore[no-untyped-def]
    sampler = _ResendingSampler()
    rig = make_rig(sampler)
    sampler.pipeline = rig.pipeline
    kept, dropped = request_trace(error=True), request_trace()
    rig.pipeline.add(kept + dropped)
    for _ in range(3):
        rig.clock.advance(1.5)
        rig.pipeline.decide_ready()
    assert rig.rows("SELECT count(*) FROM requests") == [(2,)]
    assert rig.rows("SELECT count(*), count(DISTINCT span_id) FROM spans") == [(6, 6)]
    stats = rig.pipeline.stats
    assert (stats.late_duplicates_dropped, stats.late_spans_dropped) == (6, 6)
