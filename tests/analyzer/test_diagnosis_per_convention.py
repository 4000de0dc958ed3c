"""Complaints found from each engine's own spans, run through the collector's real pipeline."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from tokentrace.analyzer.report import build_report
from tokentrace.analyzer.spans import Span
from tokentrace.collector.pipeline import Pipeline
from tokentrace.collector.sampling import Sampler
from tokentrace.collector.writer import WriteBatch, Writer
from tokentrace.store.connection import open_db, open_read_only

from . import spanfactory as f
from . import workloads
from .workloads import Req, Workload

pytestmark = pytest.mark.slow


def _run_pipeline(db: Path, traces: list[list[Span]], w: Workload) -> None:
    writer = Writer(open_db(db))
    pipeline = Pipeline(writer, Sampler(baseline=0.05))
    try:
        for spans in traces:
            while not pipeline.add(spans):
                pipeline.decide_ready(force=True)
        pipeline.add_engine_data(WriteBatch(engine_steps=w.engine_steps, gpu_samples=w.gpu_samples))
        pipeline.decide_ready(force=True)
    finally:
        pipeline.close()
        writer.close()
        writer._conn.close()


def _who(r: Req, spans: list[Span]) -> list[Span]:
    """Puts the request's tenant, class, environment and instance where engines carry them."""
    server = spans[0]
    server.attributes["tenant.id"] = r.tenant
    server.attributes["tokentrace.traffic_class"] = r.traffic_class
    server.resource = {**server.resource, "service.instance.id": r.instance}
    if r.environment:
        server.resource["deployment.environment.name"] = r.environment
    if r.cold:
        server.attributes["tokentrace.cold_start"] = True
    return spans


def vllm(r: Req) -> list[Span]:
    return _who(r, _vllm(r))


def _vllm(r: Req) -> list[Span]:
    return f.vllm_trace(r.queue_ms + r.tokenize_ms, r.prefill_ms, r.decode_ms, tokens=r.output,
                        prompt=r.prompt, wire=r.network_ms, t0_ns=r.arrival_ns)[0]


def sglang(r: Req) -> list[Span]:
    return _who(r, _sglang(r))


def _sglang(r: Req) -> list[Span]:
    return f.sglang_trace(r.tokenize_ms, r.queue_ms, r.prefill_ms, r.decode_ms, other=0.5,
                          tokens=r.output, prompt=r.prompt, wire=r.network_ms, t0_ns=r.arrival_ns)[0]


def tgi(r: Req) -> list[Span]:
    spans = f.tgi_trace(r.tokenize_ms, r.queue_ms, r.prefill_ms, 0.0, r.output, gaps=r.gaps_ms,
                        wire=r.network_ms, t0_ns=r.arrival_ns)[0]
    spans[0].attributes["gen_ai.usage.input_tokens"] = r.prompt
    return _who(r, spans)


def client_only(r: Req) -> list[Span]:
    server = r.tokenize_ms + r.queue_ms + r.prefill_ms + r.decode_ms + 1.0
    ttft = (r.network_ms or 0) + r.tokenize_ms + r.queue_ms + r.prefill_ms
    itl = r.decode_ms / max(1, r.output - 1)
    return f.genai_client_trace(ttft, itl, r.output, server_ms=server, t0_ns=r.arrival_ns)[0]


CASES: list[tuple[str, str, Callable[[Req], list[Span]]]] = [
    ("long_wait_then_fast", "vllm", vllm),
    ("long_wait_then_fast", "sglang", sglang),
    ("long_wait_then_fast", "tgi", tgi),
    ("tiny_prompts_slow", "vllm", vllm),
    ("tiny_prompts_slow", "genai_client", client_only),
    ("stutter", "tgi", tgi),
    ("peak_hours", "sglang", sglang),
    ("bad_in_production", "vllm", vllm),
    ("big_tenants_slower", "sglang", sglang),
    ("batch_mode_breaks_live", "vllm", vllm),
    ("cold_start", "vllm", vllm),
]


@pytest.mark.parametrize(("complaint", "source", "to_spans"), CASES, ids=[f"{c}-{s}" for c, s, _ in CASES])
def test_complaint_from_engine_spans(tmp_path: Path, complaint: str, source: str,
                                     to_spans: Callable[[Req], list[Span]]) -> None:
    w = workloads.SCENARIOS[complaint]()
    rng = random.Random(0)
    raw = w.raw if len(w.raw) <= 1500 else rng.sample(w.raw, 1500)
    _run_pipeline(tmp_path / "db.duckdb", [to_spans(r) for r in raw], w)
    conn = open_read_only(tmp_path / "db.duckdb")
    try:
        sources = {row[0] for row in conn.execute("SELECT DISTINCT source FROM requests").fetchall()}
        assert sources == {source}
        report = build_report(conn)
        findings = report["findings"]
        assert findings and findings[0]["complaint"] == complaint, [
            (x["complaint"], x["confidence"]) for x in findings
        ]
        assert report["requests"]["kept_traces"] > 0
        kept = {t for (t,) in conn.execute("SELECT trace_id FROM kept_traces").fetchall()}
        assert set(findings[0]["example_traces"]) <= kept
    finally:
        conn.close()


def test_healthy_engine_spans_have_no_finding(tmp_path: Path) -> None:
    w = workloads.healthy()
    _run_pipeline(tmp_path / "db.duckdb", [vllm(r) for r in w.raw], w)
    conn = open_read_only(tmp_path / "db.duckdb")
    try:
        assert build_report(conn)["findings"] == []
    finally:
        conn.close()
