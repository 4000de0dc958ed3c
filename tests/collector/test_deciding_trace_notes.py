"""Traces that yield no request, noted at decision time: an engine's start-up is kept whole
with an `engine_starts` row; a trace of no known convention gets an `unmatched_traces` row
(its root span's name, for the report's coverage), and is sampled as any other."""

from __future__ import annotations

import json
from pathlib import Path

from otlp_traces import T0, new_id, request_trace, to_json

from tokentrace.analyzer.spans import KIND_INTERNAL, KIND_SERVER, Span
from tokentrace.collector.deciding import ENGINE_START_DECISION, decide_trace
from tokentrace.collector.otlp_file import read_otlp_file
from tokentrace.collector.sampling import Decision, P99Tracker, Sampler
from tokentrace.collector.settings import CollectorSettings
from tokentrace.collector.trace_buffer import PendingTrace
from tokentrace.file_import import import_files
from tokentrace.store.connection import open_read_only
from tokentrace.store.reasons import REASON_DROPPED, REASON_ENGINE_START

STARTUP = Path(__file__).resolve().parents[1] / "data" / "engines" / "vllm_startup.jsonl"


def _sampler() -> Sampler:
    return Sampler(baseline=0.0, p99=P99Tracker(warmup=0))


def custom_trace(start_ns: int = T0) -> list[Span]:
    """Gives an app's own LLM call spans: `llm.request` with two children, no convention."""
    trace_id, root_id = new_id(16), new_id(8)
    resource = {"service.name": "my-app"}
    ms = 1_000_000
    return [
        Span(trace_id, root_id, "", "llm.request", KIND_SERVER, start_ns, start_ns + 900 * ms,
             {"model": "mine"}, resource),
        Span(trace_id, new_id(8), root_id, "llm.prefill", KIND_INTERNAL, start_ns + ms,
             start_ns + 200 * ms, {}, resource),
        Span(trace_id, new_id(8), root_id, "llm.decode", KIND_INTERNAL, start_ns + 200 * ms,
             start_ns + 890 * ms, {}, resource),
    ]  # fmt: skip


def test_vllm_startup_trace_is_kept_whole_with_its_phases() -> None:
    spans = read_otlp_file(STARTUP)
    outcome = decide_trace(spans[0].trace_id, PendingTrace(list(spans), 0), _sampler())
    assert outcome.decision == ENGINE_START_DECISION and outcome.decision.reason == REASON_ENGINE_START
    assert outcome.spans is not None and len(outcome.spans) == 12
    start = outcome.engine_start
    assert start is not None and outcome.unmatched is None
    # the front end's process (the root's), which then serves the requests
    assert start.instance == "pid 5092"
    assert list(start.phases)[0] == "Overall Loading"
    assert 31_900 < start.phases["Overall Loading"] < 32_000
    assert start.phases["Allocate KV cache"] > start.phases["Load weights"] > 0
    assert (start.end_ns - start.start_ns) / 1e6 >= start.phases["Overall Loading"]


def test_a_custom_span_trace_is_noted_by_its_root_and_sampled_as_any() -> None:
    spans = custom_trace()
    outcome = decide_trace(spans[0].trace_id, PendingTrace(list(spans), 0), _sampler())
    assert outcome.result.requests == [] and outcome.engine_start is None
    assert outcome.decision == Decision(False, REASON_DROPPED, 1.0)
    note = outcome.unmatched
    assert note is not None
    assert (note.root_name, note.span_count, note.service, note.start_ns) == ("llm.request", 3, "my-app", T0)


def test_a_trace_that_yields_a_request_is_no_note() -> None:
    spans = request_trace()
    outcome = decide_trace(spans[0].trace_id, PendingTrace(list(spans), 0), _sampler())
    assert outcome.result.requests and outcome.unmatched is None and outcome.engine_start is None


def test_imported_twice_each_trace_is_noted_once(tmp_path: Path) -> None:
    custom = tmp_path / "custom.json"
    traces = [custom_trace(T0 + i * 10**9) for i in range(3)]
    custom.write_text(json.dumps(to_json([s for t in traces for s in t])))
    db = tmp_path / "notes.duckdb"
    for _ in range(2):
        # baseline 0: the unmatched traces would otherwise each be a coin toss of the
        # baseline sample (kept whole, with a kept_traces row of their own)
        import_files(CollectorSettings(db=db, baseline=0.0), [STARTUP, custom])
    conn = open_read_only(db)
    try:
        starts = conn.execute("SELECT trace_id, instance, phases FROM engine_starts").fetchall()
        notes = conn.execute(
            "SELECT root_name, service, span_count, count(*) FROM unmatched_traces GROUP BY ALL"
        ).fetchall()
        kept = conn.execute("SELECT reason, span_count FROM kept_traces").fetchall()
        requests = conn.execute("SELECT count(*) FROM requests").fetchall()
    finally:
        conn.close()
    assert len(starts) == 1 and starts[0][1] == "pid 5092"
    assert "Load weights" in json.loads(starts[0][2])
    assert notes == [("llm.request", "my-app", 3, 3)]
    assert kept == [(REASON_ENGINE_START, 12)]
    assert requests == [(0,)]
