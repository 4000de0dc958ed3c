"""What the report's names mean, said in the report: a legend under the latency table and the
buckets for the rows shown, and an empty report that says where to send the spans."""

from __future__ import annotations

from typing import Any

import pytest

from tokentrace.analyzer.render import (
    DEFAULT_OTLP_GRPC,
    DEFAULT_OTLP_HTTP,
    no_requests_message,
    render_markdown,
    render_text,
)
from tokentrace.collector.settings import CollectorSettings


def _report(*, client: bool = True, tokens: bool = True, queue_parts: bool = True, count: int = 40) -> dict[str, Any]:
    pcts = {"p50": 100.0, "p90": 200.0, "p95": 300.0, "p99": 400.0}
    none = dict.fromkeys(pcts)
    buckets: dict[str, Any] = {b: {**pcts, "share": 0.25} for b in ("network", "queue", "prefill", "decode")}
    buckets["network"]["measured"] = client
    parts = {"queue_wait": 0.5, "tokenize": 0.1, "other": 0.4}
    buckets["queue"]["parts"] = parts if queue_parts else dict.fromkeys(parts)
    return {
        "window": {"start_ns": 1_750_000_000 * 10**9, "end_ns": 1_750_000_060 * 10**9, "filters": {}},
        "requests": {"count": count, "kept_traces": 3, "errors": 0, "with_client_span": count if client else 0},
        "latency": {
            "e2e": pcts, "ttft": pcts, "ttft_client": pcts if client else none,
            "tpot": pcts if tokens else none, "itl": pcts if tokens else none,
        },
        "buckets": buckets,
        "findings": [],
    }  # fmt: skip


def _plain(markdown: str) -> str:
    return markdown.replace("**", "").replace("\\_", "_")


def _between(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end)]


def test_the_text_report_says_what_each_row_means_under_its_table() -> None:
    text = render_text(_report())
    latency = _between(text, "latency ", "where the time goes")
    assert "TTFT: time to first token as the server saw it" in latency
    assert "TTFT (user): as the client saw it, network included" in latency
    assert "TPOT: time per output token after the first" in latency
    assert "ITL: gap between consecutive tokens" in latency
    buckets = _between(text, "where the time goes", "diagnosis")
    # prefill is not TTFT: the user's TTFT also holds the network and the queue
    assert "prefill: the compute part of TTFT" in buckets
    assert "queue_wait: measured scheduler wait" in buckets and "other: the rest of the queue" in buckets
    assert "kept traces: requests whose whole span tree was kept" in text
    # the legend follows its table: the rows come first
    lines = text.splitlines()
    assert lines.index(next(ln for ln in lines if ln.startswith("ITL "))) < lines.index(
        next(ln for ln in lines if "TPOT: " in ln)
    )


def test_the_legend_names_only_the_rows_shown() -> None:
    bare = _report(client=False, tokens=False, queue_parts=False)
    for out in (render_text(bare), _plain(render_markdown(bare))):
        assert "TTFT: time to first token" in out
        for gone in ("TTFT (user):", "TPOT:", "ITL:", "queue_wait:"):
            assert gone not in out, gone
    empty = _report(count=0)
    for out in (render_text(empty), _plain(render_markdown(empty))):
        assert "TTFT:" not in out and "kept traces: requests" not in out


def test_the_markdown_report_has_the_legend_too() -> None:
    md = render_markdown(_report())
    latency = _between(md, "## Latency", "## Where the time goes")
    assert "**TTFT (user)**: as the client saw it, network included" in latency
    assert "**ITL**: gap between consecutive tokens" in latency
    buckets = _between(md, "## Where the time goes", "## Diagnosis")
    assert "**prefill**: the compute part of TTFT" in buckets
    assert "**kept traces**: requests whose whole span tree was kept" in md


def test_an_empty_report_says_where_to_send_the_spans() -> None:
    report = _report(count=0)
    said = no_requests_message(report)
    # nothing says where the collector listens: serve's defaults, named as such
    assert DEFAULT_OTLP_HTTP in said and DEFAULT_OTLP_GRPC in said, said
    defaults = CollectorSettings()
    assert DEFAULT_OTLP_HTTP == f"http://{defaults.otlp_bind_host}:{defaults.http_port}"
    assert DEFAULT_OTLP_GRPC == f"{defaults.otlp_bind_host}:{defaults.grpc_port}"
    # a server that says where it listens is quoted as it is
    report["otlp"] = {"http": "http://10.0.0.5:14318", "grpc": "10.0.0.5:14317"}
    said = no_requests_message(report)
    assert "http://10.0.0.5:14318" in said and "10.0.0.5:14317" in said and DEFAULT_OTLP_HTTP not in said
    assert said in render_text(report)


@pytest.mark.parametrize("otlp", [{"http": "http://x:1\x1b[2J"}, {"http": 5}, "nonsense"])
def test_odd_collector_addresses_are_shown_safely_or_not_at_all(otlp: object) -> None:
    report = _report(count=0)
    report["otlp"] = otlp
    said = no_requests_message(report)
    assert "\x1b" not in said and "OTLP" in said
