"""The report says what client-only requests could not measure.

A trace with client spans only (OTel GenAI, OpenLLMetry, OpenInference; no server span)
has no network figure, and its whole wait for the first token is counted as prefill.
The report used to say "network not measured (no client spans: instrument the client)"
for such traffic, the opposite of the truth, and nothing about the prefill it showed.
"""

from __future__ import annotations

import random
from pathlib import Path

import httpx
from tt_testkit import explorer

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.render import render_markdown, render_text
from tokentrace.analyzer.render_html import render_html
from tokentrace.analyzer.report import build_report
from tokentrace.analyzer.summary import RequestSummary

from .spanfactory import MS, genai_client_trace, sdk_trace
from .workloads import Workload

SERVER_SIDE = "instrument the server to split the wait for the first token"


def _requests(client_only: int, server_seen: int) -> list[RequestSummary]:
    rng = random.Random(3)
    out = []
    for i in range(client_only + server_seen):
        t0 = 1_700_000_000 * 10**9 + round(i * 2000 * MS)
        if i < client_only:
            spans, _ = genai_client_trace(300.0 + rng.uniform(0, 50), 20.0, 20, t0_ns=t0)
        else:
            spans, _ = sdk_trace(1.0, 5.0, 300.0, 20.0, 20, t0_ns=t0)
        out += summarize_trace(spans).requests
    return out


def test_client_only_traffic_asks_for_the_server(write_workload) -> None:  # type: ignore[no-untyped-def]
    report = build_report(write_workload(Workload(_requests(30, 0))))
    assert report["requests"]["server_unseen"] == 30
    text = render_text(report)
    assert f"network   not measured (client spans only: {SERVER_SIDE})" in text
    assert "no client spans" not in text
    assert "Every request was seen only by the client" in text
    for rendered in (render_markdown(report), render_html(report)):
        assert SERVER_SIDE in rendered and "Every request was seen only by the client" in rendered
        assert "no client spans" not in rendered


def test_server_only_traffic_asks_for_the_client(write_workload) -> None:  # type: ignore[no-untyped-def]
    report = build_report(write_workload(Workload(_requests(0, 30))))
    assert report["requests"]["server_unseen"] == 0
    text = render_text(report)
    assert "network   not measured (no client spans: instrument the client)" in text
    assert "seen only by the client" not in text
    assert "Network not measured: no client spans" in render_html(report)


def test_mixed_traffic_counts_the_client_only_requests(write_workload) -> None:  # type: ignore[no-untyped-def]
    report = build_report(write_workload(Workload(_requests(12, 28))))
    note = "12 of 40 requests were seen only by the client (no server spans)"
    assert note in render_text(report) and note in render_html(report)
    assert note in render_markdown(report).replace("\\", "")


def test_the_explorer_says_the_same(write_workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    conn = write_workload(Workload(_requests(30, 0)), "web.duckdb")
    conn.close()
    with explorer(tmp_path / "web.duckdb") as url:
        for page in ("/", "/diagnosis"):
            html = httpx.get(url + page, timeout=60).text
            assert SERVER_SIDE in html and "Every request was seen only by the client" in html, page
            assert "no client spans" not in html, page
