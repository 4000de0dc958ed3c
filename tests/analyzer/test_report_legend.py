"""What the report's names mean, said in the report: a legend under the latency table and the
buckets for the rows shown, and an empty report that says where to send the spans."""

from __future__ import annotations

from typing import Any

import pytest

from tokentrace.analyzer.diagnosis._base import MAX_EXAMPLES
from tokentrace.analyzer.render import (
    DEFAULT_OTLP_GRPC,
    DEFAULT_OTLP_HTTP,
    EXAMPLES_SHOWN,
    legend,
    no_requests_message,
    printable,
    render_markdown,
    render_text,
)
from tokentrace.analyzer.render_html import render_html
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


def test_the_html_report_has_the_same_legend_and_queue_parts() -> None:
    report = _report()
    report["latency"]["approximate"] = {"itl": ["p50", "p90", "p95", "p99"]}
    page = render_html(report)
    terms = legend(report)
    latency = _between(page, "<h2>Latency</h2>", "<h2>Latency over time</h2>")
    buckets = _between(page, "<h2>Where the time goes</h2>", "<h2>Inter-token gaps</h2>")
    for where, lines in ((latency, terms["latency"]), (buckets, terms["buckets"] + terms["requests"])):
        for line in lines:
            said = "; ".join(f"<b>{name}</b>: {meaning}" for name, meaning in line).replace("'", "&#x27;")
            assert said in where, said
    # the queue's parts, the names the legend explains, and ITL's ≈ in the legend as in text
    assert "queue = queue_wait 50.0 %, tokenize 10.0 %, other 40.0 %" in buckets
    assert "<b>queue_wait</b>: measured scheduler wait" in buckets
    assert "<b>ITL</b>: gap between consecutive tokens (≈: estimated from per-request histograms" in latency
    assert "queue_wait" not in render_html(_report(queue_parts=False))


def test_the_markdown_report_gives_the_queue_parts_and_explains_them() -> None:
    md = render_markdown(_report())
    buckets = _between(md, "## Where the time goes", "## Diagnosis")
    assert "queue = queue\\_wait 50.0 %, tokenize 10.0 %, other 40.0 %" in buckets
    assert "**queue_wait**: measured scheduler wait (vLLM: its engine core's queue only); **tokenize**: measured tokenization" in buckets
    bare = _between(render_markdown(_report(queue_parts=False)), "## Where the time goes", "## Diagnosis")
    assert "queue =" not in bare and "queue_wait" not in bare


def _with_finding(complaint: str, examples: list[str]) -> dict[str, Any]:
    report = _report()
    report["findings"] = [
        {"complaint": complaint, "title": "It starts responding, then freezes or stutters", "confidence": 0.7,
         "evidence": [{"text": "stalls"}], "example_traces": examples, "fix_first": "Fix it.",
         "affected_trace_ids": examples},
    ]  # fmt: skip
    return report


def test_every_format_shows_the_same_example_traces() -> None:
    ids = [f"{i:032x}" for i in range(1, MAX_EXAMPLES + 3)]
    report = _with_finding("stutter", ids)
    assert EXAMPLES_SHOWN == MAX_EXAMPLES  # all that a finding holds (`pick_examples`)
    for render in (render_text, render_markdown, render_html):
        out = render(report)
        shown = [t for t in ids if t in out]
        assert shown == ids[:EXAMPLES_SHOWN], (render.__name__, len(shown))


def test_markdown_code_spans_show_their_content_as_it_is() -> None:
    ids = ["ab" * 16, "a`b", "`x", "x|y<z>", "c\\d"]
    md = render_markdown(_with_finding("peak_hours", ids))
    # a backslash inside a code span is shown: no escapes there
    assert "(`peak_hours`, confidence 70 %)" in md and "peak\\_hours" not in md
    assert "Example traces: `" + "ab" * 16 + "`, ``a`b``, `` `x ``, `x|y<z>`, `c\\d`" in md
    markdown_it = pytest.importorskip("markdown_it")
    line = next(ln for ln in md.splitlines() if "Example traces" in ln)
    tokens = markdown_it.MarkdownIt("commonmark").parseInline(line)[0].children
    assert [t.content for t in tokens if t.type == "code_inline"] == ids


def test_span_values_cannot_break_out_of_a_code_span() -> None:
    evil = "x`\n3. **forged** `y\x1b[2J"
    md = render_markdown(_with_finding(evil, [evil]))
    assert "\x1b" not in md and "\n3. **forged**" not in md
    # the whole value stays inside its spans, written out as text writes it
    markdown_it = pytest.importorskip("markdown_it")
    for line in (ln for ln in md.splitlines() if "forged" in ln):
        tokens = markdown_it.MarkdownIt("commonmark").parseInline(line)[0].children
        assert printable(evil) in [t.content for t in tokens if t.type == "code_inline"], line
