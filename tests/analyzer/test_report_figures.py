"""What a newcomer reads in the report: figures that add up, one way to write a duration or a
confidence, the findings' order said, advice that follows the evidence, clean exports."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tokentrace.analyzer.diagnosis import tiny_prompts
from tokentrace.analyzer.diagnosis._base import FIX_FIRST, ms
from tokentrace.analyzer.export import write_requests
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.render import FINDINGS_ORDER, format_ms, render_markdown, render_text
from tokentrace.analyzer.render_html import COLORS, render_html
from tokentrace.analyzer.report import build_report

from . import workloads

REPO = Path(__file__).resolve().parents[2]


def _finding(report: dict[str, Any], complaint: str) -> dict[str, Any]:
    found = {f["complaint"]: f for f in report["findings"]}
    assert complaint in found, [(f["complaint"], f["confidence"]) for f in report["findings"]]
    return found[complaint]


def _durations(text: str) -> list[float]:
    """Gives the durations written in `text`, in ms ('246 ms', '1.20 s')."""
    return [float(v) * (1000 if unit == "s" else 1) for v, unit in re.findall(r"(\d+(?:\.\d+)?) (ms|s)\b", text)]


def _tolerance(text: str) -> float:
    """Gives how far written durations may sum from their total: half a unit a figure."""
    return sum(5.0 if unit == "s" else 0.5 for unit in re.findall(r"\d (ms|s)\b", text))


# --- 1. one duration formatter; the HTML chart's labels are whole ---------------------------------


def test_html_writes_durations_as_the_text_report_does_and_its_axis_labels_fit() -> None:
    report = _synthetic_report(e2e_p90=3829.5, top=6814.4)
    page = render_html(report)
    # 3.83 s as in the text and markdown reports, not "3829.5 ms"
    assert "<td>3.83 s</td>" in page and "3829.5" not in page
    assert "3.83 s" in render_text(report) and "3.83 s" in render_markdown(report)
    # the y axis ends on a round figure, written like every other duration
    labels = re.findall(r'<text x="([\d.]+)" y="[\d.]+" text-anchor="end" font-size="10">([^<]+)</text>', page)
    y_labels = [(float(x), text) for x, text in labels if "min" not in text]
    assert ("8.00 s" in [t for _, t in y_labels]) and all(t == "0" or t.endswith(" s") for _, t in y_labels)
    # right-aligned at x: the label's start (about 6 px a character at 10 px) stays in the picture
    assert all(x - 6 * len(text) >= 0 for x, text in y_labels), y_labels
    assert all(x - 6 * len(format_ms(999.94)) >= 0 for x, _ in y_labels)


# --- 2. tiny_prompts_slow: the evidence's figures add up ------------------------------------------


@pytest.mark.parametrize("name", ["tiny_prompts_slow", "slow_gateway", "tiny_prompts_mixed_overhead"])
def test_tiny_prompts_evidence_figures_add_up(write_workload, name: str) -> None:  # type: ignore[no-untyped-def]
    w = workloads.SCENARIOS[name]() if name in workloads.SCENARIOS else getattr(workloads, name)()
    f = _finding(build_report(write_workload(w)), "tiny_prompts_slow")
    share_line, split_line, *_ = f["evidence"]
    # "k of n requests (p %) spend at least half their wait for the first token on network +
    # queue (median share s %; ...)"
    k, n = share_line["overhead_bound_requests"], share_line["requests"]
    assert f"{k} of {n} requests ({k / n * 100:.0f} %)" in share_line["text"], share_line["text"]
    # a median share of half or more: at least half the requests spend half or more
    assert share_line["overhead_share"] >= 0.5 and k >= n / 2
    assert f"median share {share_line['overhead_share'] * 100:.0f} %" in share_line["text"]
    # the split is over those same k requests, and its parts are their wait for the first token
    net, queue = split_line["overhead_bound_network_mean_ms"], split_line["overhead_bound_queue_mean_ms"]
    compute, wait = split_line["overhead_bound_compute_mean_ms"], split_line["overhead_bound_wait_mean_ms"]
    assert net + queue + compute == pytest.approx(wait, abs=1e-3)
    assert (net + queue) / wait >= 0.5  # each of them spends half or more: so do their sums
    text = split_line["text"]
    # the first line's figures are medians, these are means: each says which
    assert text.startswith(f"those {k} wait {ms(wait)} for their first token (mean): "), text
    assert "(means); most of it is" in text
    assert f"median network + queue {ms(share_line['overhead_p50_ms'])} of a median " in share_line["text"]
    assert f"median E2E {ms(share_line['e2e_p50_ms'])})" in share_line["text"]
    total, *parts = _durations(text)
    assert len(parts) == 3 and sum(parts) == pytest.approx(total, abs=_tolerance(text)), text
    # and "most of it" is decided on those same figures
    assert split_line["where"] == ("network" if net > queue else "queue")
    assert text.endswith(f"most of it is {split_line['where']}")
    # the generic advice follows only for the parts of the wait that are real (tiny_prompts.fix_then);
    # where the queue is split, its largest part leads and "cap queue depth" is for its scheduler wait
    parts = next((e for e in f["evidence"] if "queue_part" in e), None)
    lead = "network" if split_line["where"] == "network" or parts is None else parts["queue_part"]
    queue_part = {"queue": queue} if parts is None else {"queue_wait": parts["overhead_bound_queue_wait_mean_ms"]}
    then = tiny_prompts.fix_then(lead, {"network": net, **queue_part}, wait)
    assert f["fix_first"].endswith(f". Then: {then}." if then else ".")
    assert f["fix_first"].count("region") <= 2, f["fix_first"]


@pytest.mark.slow
def test_tiny_prompts_where_follows_the_time_not_per_bucket_medians(write_workload) -> None:  # type: ignore[no-untyped-def]
    # far-away users and a slow gateway at once: most tiny requests have little network and
    # little queue, so medians per bucket said "network" for a window that loses more to the queue
    f = _finding(build_report(write_workload(workloads.tiny_prompts_mixed_overhead())), "tiny_prompts_slow")
    split = f["evidence"][1]
    assert split["overhead_bound_queue_mean_ms"] > split["overhead_bound_network_mean_ms"]
    assert split["where"] == "queue" and split["text"].endswith("most of it is queue")
    # the queue's largest part leads the advice: the slow gateway's time is measured as tokenize
    assert f["fix_first"].startswith("Tokenization is "), f["fix_first"]


# --- 3. confidence: a whole percent with a space --------------------------------------------------


def test_confidence_reads_as_a_whole_percent_in_every_format() -> None:
    report = _synthetic_report(confidence=0.715)
    for render in (render_text, render_markdown, render_html):
        out = render(report)
        assert "confidence 72 %" in out, render.__name__
        assert "71.5" not in out and "72%" not in out and "0.71" not in out
    # tools keep the number
    assert json.loads(json.dumps(report))["findings"][0]["confidence"] == 0.715


# --- 4. the findings' order said; several services said -------------------------------------------


def test_reports_say_how_findings_are_ordered_and_when_they_mix_services(write_workload) -> None:  # type: ignore[no-untyped-def]
    conn = write_workload(workloads.two_services())
    mixed = build_report(conn)
    assert mixed["requests"]["services"] == 2 and mixed["findings"]
    assert "confidence, weighted by the share of the window's end-to-end time" in FINDINGS_ORDER
    text, md, page = render_text(mixed), render_markdown(mixed), render_html(mixed)
    assert FINDINGS_ORDER in text and "These findings mix 2 services: --service NAME picks one." in text
    assert "These findings mix 2 services: `--service NAME` picks one." in md
    assert "These findings mix 2 services: <code>--service NAME</code> picks one." in page
    assert "Most important first" in md and "Most important first" in page
    one = build_report(conn, Filters(service="fleet"))
    assert one["requests"]["services"] == 1
    for render in (render_text, render_markdown, render_html):
        assert "findings mix" not in render(one) and "Most important first" in render(one)


# --- 5. fix first follows the cause the evidence shows --------------------------------------------


@pytest.mark.slow
def test_stutter_beside_large_prefills_says_chunked_prefill_first(write_workload) -> None:  # type: ignore[no-untyped-def]
    f = _finding(build_report(write_workload(workloads.stutter())), "stutter")
    linked = f["evidence"][1]
    assert linked["stalled_with_large_prefill"] > linked["smooth_with_large_prefill"] + 0.15
    assert f["fix_first"].startswith("Enable chunked prefill"), f["fix_first"]
    assert f"≥ {linked['large_prefill_tokens']}-token prefill steps" in f["fix_first"]
    assert "--enable-chunked-prefill" in f["fix_first"] and "--max-num-batched-tokens" in f["fix_first"]
    # docs/design.md §5's advice still follows
    assert f["fix_first"].endswith(". Then: reduce decode batching, separate long and short requests.")


def test_peak_hours_leads_with_capacity_not_a_batch_delay(write_workload) -> None:  # type: ignore[no-untyped-def]
    f = _finding(build_report(write_workload(workloads.peak_hours())), "peak_hours")
    ratio = f["evidence"][1]["arrival_ratio"]
    assert f["fix_first"].startswith("Add capacity for the busy "), f["fix_first"]
    assert f"({ratio:.1f}× the usual arrivals)" in f["fix_first"]
    # a batch delay is named only as a condition, after the cause-specific fix
    assert not f["fix_first"].startswith("Lower the batch delay")
    assert "lower the batch delay where the server waits to fill batches" in f["fix_first"]


# --- 6. exports: microsecond ms, ISO 8601 UTC start -----------------------------------------------


def test_exports_round_milliseconds_and_write_start_in_utc(write_workload) -> None:  # type: ignore[no-untyped-def]
    conn = write_workload(workloads.healthy())
    out_csv, out_jsonl, out_pq = io.BytesIO(), io.BytesIO(), io.BytesIO()
    write_requests(conn, Filters(), "csv", out_csv, limit=200)
    write_requests(conn, Filters(), "jsonl", out_jsonl, limit=200)
    write_requests(conn, Filters(), "parquet", out_pq, limit=200)
    rows = list(csv.DictReader(io.StringIO(out_csv.getvalue().decode())))
    lines = [json.loads(x) for x in out_jsonl.getvalue().decode().splitlines()]
    assert len(rows) == len(lines) == 200
    iso = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
    ms_cols = [c for c in rows[0] if c.endswith("_ms")]
    assert "e2e_ms" in ms_cols and "tpot_ms" in ms_cols
    noisy = 0
    for row, line in zip(rows, lines, strict=True):
        assert iso.match(row["start"]) and row["start"] == line["start"], (row["start"], line["start"])
        for c in ms_cols:
            if row[c] == "":
                assert line[c] is None
                continue
            assert re.fullmatch(r"\d+(\.\d{1,3})?", row[c]), (c, row[c])
            assert float(row[c]) == line[c] and len(repr(line[c]).split(".")[-1]) <= 3, (c, line[c])
    # Parquet keeps the full floats (the rounding is for text)
    table = pq.read_table(io.BytesIO(out_pq.getvalue())).to_pylist()
    for full, line in zip(table, lines, strict=True):
        assert full["tpot_ms"] == pytest.approx(line["tpot_ms"], abs=5e-4)
        noisy += round(full["tpot_ms"], 3) != full["tpot_ms"]
    assert noisy  # the workload's TPOTs have more digits than a microsecond: the test sees rounding


def test_csv_rounding_keeps_the_formula_guard(write_workload) -> None:  # type: ignore[no-untyped-def]
    w = workloads.healthy()
    w.requests[0].model = "=HYPERLINK(\"http://x\")"
    out = io.BytesIO()
    write_requests(write_workload(w), Filters(), "csv", out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue().decode())))
    cell = next(r["model"] for r in rows if "HYPERLINK" in r["model"])
    assert cell.startswith("'=") and rows[0]["start"].endswith("Z")


# --- 7. singular and plural ------------------------------------------------------------------------


@pytest.mark.slow
def test_evidence_and_headers_say_one_thing_in_the_singular(write_workload) -> None:  # type: ignore[no-untyped-def]
    fleet = _finding(build_report(write_workload(workloads.two_services()), Filters(service="fleet")), "cold_start")
    assert fleet["evidence"][0]["text"].startswith("3 cold requests on 3 instances waited "), fleet["evidence"]
    tenants = _finding(build_report(write_workload(workloads.big_tenants_slower(), name="b.duckdb")),
                       "big_tenants_slower")
    first, volume, *_ = tenants["evidence"]
    assert first["text"].startswith("the heaviest tenant (megacorp) waits longer"), first["text"]
    assert volume["text"].startswith("megacorp sends "), volume["text"]
    for f in (fleet, tenants):
        assert not any("(s)" in e["text"] for e in f["evidence"])
    one = _synthetic_report(count=1, kept=1, errors=1)
    assert "**1** request, 1 kept trace, 1 error." in render_markdown(one)
    assert "<b>1</b> request · 1 kept trace · 1 error</p>" in render_html(one)


def test_evidence_durations_switch_to_seconds_on_the_rounded_figure() -> None:
    assert [ms(v) for v in (None, 12.4, 999.4, 999.7, 1234.5)] == ["—", "12 ms", "999 ms", "1.00 s", "1.23 s"]
    assert ms(float("nan")) == "—"  # round() of a NaN raised, and the report with it


# --- 8. the explorer's bucket colours -------------------------------------------------------------


def test_html_report_uses_the_explorers_bucket_colours() -> None:
    css = (REPO / "web" / "static" / "app.css").read_text()
    web = {b: re.search(rf"--{var}:\s*(#[0-9a-fA-F]{{6}})", css).group(1).lower()  # type: ignore[union-attr]
           for b, var in (("network", "net"), ("queue", "queue"), ("prefill", "prefill"), ("decode", "decode"))}
    assert {b: COLORS[b].lower() for b in web} == web
    page = render_html(_synthetic_report())
    for b, colour in web.items():
        assert f'fill="{colour}"><title>{b} ' in page.lower()


# --- a report to render, without a database -------------------------------------------------------


def _synthetic_report(
    *, e2e_p90: float = 900.0, top: float = 1200.0, confidence: float = 0.8,
    count: int = 500, kept: int = 20, errors: int = 0,
) -> dict[str, Any]:
    pcts = {"p50": 100.0, "p90": e2e_p90, "p95": 1000.0, "p99": 1100.0}
    none = dict.fromkeys(pcts)
    buckets: dict[str, Any] = {b: {**pcts, "share": 0.25} for b in ("network", "queue", "prefill", "decode")}
    buckets["network"]["measured"] = True
    buckets["queue"]["parts"] = {"queue_wait": 1.0, "tokenize": 0.0, "other": 0.0}
    t0 = 1_750_000_000 * 10**9
    points = [
        {"start_ns": t0 + i * 10**10, "requests": 5, "e2e_p50": 100.0, "e2e_p95": 300.0,
         "e2e_p99": top if i == 3 else 400.0, "ttft_p50": 50.0, "ttft_p95": 80.0, "queue_share": 0.1}
        for i in range(6)
    ]  # fmt: skip
    return {
        "window": {"start_ns": t0, "end_ns": t0 + 6 * 10**10, "filters": {}},
        "requests": {"count": count, "kept_traces": kept, "errors": errors, "with_client_span": count},
        "latency": {"e2e": pcts, "ttft": pcts, "ttft_client": none, "tpot": none, "itl": none},
        "buckets": buckets,
        "findings": [
            {"complaint": "stutter", "title": "It starts responding, then freezes or stutters",
             "confidence": confidence, "evidence": [{"text": "a gap"}], "example_traces": ["ab" * 16],
             "fix_first": FIX_FIRST["stutter"], "affected_trace_ids": ["ab" * 16]},
        ],  # fmt: skip
        "timeline": {"slice_ns": 10**10, "points": points},
        "itl_histogram": [{"le_ms": 5.0, "count": 10}, {"le_ms": None, "count": 1}],
    }
