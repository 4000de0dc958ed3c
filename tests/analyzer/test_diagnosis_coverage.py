"""The report's coverage (issue 22): which signals the window had, which complaints it could
check and, where not, what to add; and the traces that matched no convention, by root span.
Every format says it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
from otlp_traces import T0, new_id, to_json

from tokentrace.analyzer.diagnosis import COMPLAINTS
from tokentrace.analyzer.diagnosis.coverage import NEEDS
from tokentrace.analyzer.engine_steps import EngineStep
from tokentrace.analyzer.render import render_markdown, render_text
from tokentrace.analyzer.render_html import render_html
from tokentrace.analyzer.report import build_report
from tokentrace.analyzer.spans import KIND_INTERNAL, KIND_SERVER, Span
from tokentrace.collector.settings import CollectorSettings
from tokentrace.collector.writer import WriteBatch, Writer
from tokentrace.file_import import import_files
from tokentrace.store.connection import open_db, open_read_only

from . import workloads


def _checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["complaint"]: c for c in report["coverage"]["complaints"]}


def _write(db: Path, w: workloads.Workload, *statements: str) -> dict[str, Any]:
    writer = Writer(open_db(db))
    assert writer.submit_wait(WriteBatch(requests=w.requests, engine_steps=w.engine_steps))
    writer.close()
    writer._conn.close()
    if statements:
        conn = duckdb.connect(str(db))
        for sql in statements:
            conn.execute(sql)
        conn.close()
    conn = open_read_only(db)
    try:
        return build_report(conn)
    finally:
        conn.close()


def test_every_complaint_says_what_it_needs() -> None:
    assert list(NEEDS) == list(COMPLAINTS)


def test_a_window_says_which_complaints_its_traces_cannot_show(tmp_path: Path) -> None:
    report = _write(tmp_path / "healthy.duckdb", workloads.healthy())
    checks = _checks(report)
    assert [c for c, check in checks.items() if check["checkable"]] == [
        "peak_hours", "big_tenants_slower", "long_wait_then_fast", "stutter", "tiny_prompts_slow",
    ]  # fmt: skip
    assert checks["bad_in_production"]["missing"].startswith("no deployment.environment on the traces: tag")
    assert "tokentrace.traffic_class=batch" in checks["batch_mode_breaks_live"]["missing"]
    assert checks["gpu_saturation"]["missing"].startswith("no GPU samples")
    assert checks["kv_cache_pressure"]["missing"].startswith("no KV-cache usage")
    # one instance, no start-up trace, no cold-start mark
    assert "start-up traces" in checks["cold_start"]["missing"]
    signals = report["coverage"]["signals"]
    assert signals["requests"] == report["requests"]["count"] and signals["tenants"] == 4
    assert signals["traffic_classes"] == {"interactive": signals["requests"]}


def test_token_time_sources_and_unknown_step_measures_are_counted(tmp_path: Path) -> None:
    w = workloads.healthy()
    w.engine_steps = [
        EngineStep("llm", "i0", s.start_ns, 20_000, None, None, None, None, None, None, [s.request_id])
        for s in w.requests[:50]
    ]  # fmt: skip
    report = _write(
        tmp_path / "sources.duckdb", w,
        "UPDATE requests SET token_times_source = 'client' WHERE request_id < 'req-2'",
        "UPDATE requests SET token_times_source = 'server' WHERE request_id >= 'req-2'",
        "UPDATE requests SET token_times_source = 'none', itl_p50_ms = NULL WHERE request_id >= 'req-9'",
    )  # fmt: skip
    signals = report["coverage"]["signals"]
    n = signals["requests"]
    by_source = signals["token_times"]
    assert sum(by_source.values()) == n and all(by_source[k] > 0 for k in ("server", "client", "none"))
    assert signals["engine_steps"] == 50 and signals["step_batch_sizes"] == 0 and signals["step_kv"] == 0
    text = render_text(report)
    said = (
        f"token times from the server on {by_source['server']:,} requests, "
        f"from the client's chunks on {by_source['client']:,}, none on {by_source['none']:,}"
    )
    assert said in text, text
    assert "50 engine steps (batch size, KV usage unknown)" in text


def test_too_few_requests_check_nothing(tmp_path: Path) -> None:
    w = workloads.healthy()
    w.requests = w.requests[:12]
    checks = _checks(_write(tmp_path / "few.duckdb", w))
    assert not any(c["checkable"] for c in checks.values())
    assert checks["stutter"]["missing"] == "too few requests (12 requests; the checks need 30)"


@pytest.mark.parametrize("fmt", ["text", "markdown", "html", "json"])
def test_every_format_says_the_coverage(tmp_path: Path, fmt: str) -> None:
    report = _write(tmp_path / "formats.duckdb", workloads.healthy())
    out = {
        "text": render_text, "markdown": render_markdown, "html": render_html,
        "json": lambda r: json.dumps(r),
    }[fmt](report)  # fmt: skip
    heading = {
        "text": "coverage: what this window's traces could show, and what they could not",
        "markdown": "## Coverage", "html": "<h2>Coverage</h2>", "json": '"coverage": {"signals"',
    }[fmt]  # fmt: skip
    assert heading in out
    assert "no GPU samples: run the SDK" in out
    if fmt != "json":
        assert "signals: token times" in out and "environments: none" in out


def custom_trace(start_ns: int) -> list[Span]:
    """Gives an app's own LLM call: `llm.request` with children, of no known convention."""
    trace_id, root_id = new_id(16), new_id(8)
    resource = {"service.name": "my-app"}
    return [
        Span(trace_id, root_id, "", "llm.request", KIND_SERVER, start_ns, start_ns + 9 * 10**8, {}, resource),
        Span(trace_id, new_id(8), root_id, "llm.generate", KIND_INTERNAL, start_ns + 10**6,
             start_ns + 8 * 10**8, {}, resource),
    ]  # fmt: skip


def test_traces_of_no_known_convention_are_counted_by_root_span(tmp_path: Path) -> None:
    spans = [s for i in range(5) for s in custom_trace(T0 + i * 10**9)]
    path = tmp_path / "custom.json"
    path.write_text(json.dumps(to_json(spans)))
    db = tmp_path / "custom.duckdb"
    import_files(CollectorSettings(db=db), [path])
    conn = open_read_only(db)
    try:
        report = build_report(conn)
    finally:
        conn.close()
    assert report["requests"]["count"] == 0
    assert report["coverage"]["unmatched_traces"] == {"count": 5, "roots": [{"name": "llm.request", "count": 5}]}
    said = (
        "5 traces matched no known span convention and gave no request row (root spans: "
        "llm.request (5)): send spans of a convention tokentrace reads"
    )
    for render in (render_text, render_markdown, render_html):
        assert said in render(report), render.__name__
