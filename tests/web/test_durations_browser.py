"""Headless Chromium: durations read alike on every page, in the cards' format or one unit per axis.

The cards and tables give a duration as `web/_format.py::ms` writes it ("849.0 ms", from 1 s
on "7.29 s"); the charts' duration axes and the trace page's offset axes must say one unit for
the whole axis (ms while the largest tick is under 1 s, s from 1 s on) with no decimal that
every tick leaves at 0, and every other duration on a page (legends, tooltips, bar labels)
must read like a card.
"""

from __future__ import annotations

import math
import re
from typing import Any

import httpx
import pytest
from web_testkit import BROWSER_MARKS, WebServer

from tokentrace.web._format import ms

pytestmark = BROWSER_MARKS

#: Records every text uPlot draws on a canvas, with its alignment and the chart it belongs to:
#: the axes' labels are nowhere in the DOM.
RECORD_CANVAS_TEXT = """
(() => {
  window.__drawn = [];
  const fillText = CanvasRenderingContext2D.prototype.fillText;
  CanvasRenderingContext2D.prototype.fillText = function (text, x, y, ...rest) {
    const chart = this.canvas.closest && this.canvas.closest('[data-chart]');
    window.__drawn.push({ text: String(text), align: this.textAlign,
                          chart: chart ? (chart.dataset.metric || chart.dataset.chart) : null });
    return fillText.call(this, text, x, y, ...rest);
  };
})();
"""
LATENCY_CHARTS = ("e2e", "ttft", "tpot", "itl")
TICK = re.compile(r"(\d{1,3}(?:,\d{3})*)(?:\.(\d+))? (ms|s)")
#: A duration as a card gives it (`ms` with its default digits).
CARD = r"\d{1,3}(?:,\d{3})*\.\d ms|\d{1,3}(?:,\d{3})*\.\d\d s"


def _axis_values_ms(labels: list[str]) -> tuple[str, list[float]]:
    """Gives an axis's unit and its ticks in ms, checking the labels keep the one-unit rule."""
    assert labels, "no tick labels"
    ticks = [TICK.fullmatch(label) for label in labels]
    assert all(ticks), f"a tick without its unit, or not a plain figure: {labels}"
    units = {t[3] for t in ticks if t}
    assert len(units) == 1, f"one axis, several units: {labels}"
    unit = units.pop()
    per = 1000.0 if unit == "s" else 1.0
    values = [float(t[1].replace(",", "") + "." + (t[2] or "0")) * per for t in ticks if t]
    assert (unit == "s") == (max(values) >= 1000), f"ms under 1 s, s from 1 s on: {labels}"
    decimals = {len(t[2] or "") for t in ticks if t}
    assert len(decimals) == 1, f"ticks with unlike decimals: {labels}"
    if decimals.pop():
        assert any(t[2] and not t[2].endswith("0") for t in ticks if t), f"a decimal every tick leaves at 0: {labels}"
    return unit, values


@pytest.mark.parametrize("db", ["web", "edited"])
def test_latency_axes_say_one_unit_chosen_by_their_range(db: str, request: pytest.FixtureRequest, page: Any) -> None:
    server: WebServer = request.getfixturevalue(db)  # edited: E2E of 10 s and more
    page.add_init_script(RECORD_CANVAS_TEXT)
    page.goto(server.url + "/")
    page.wait_for_selector('[data-metric="itl"] .uplot')
    drawn = page.evaluate("window.__drawn")
    units = {}
    for chart in LATENCY_CHARTS:
        # the y axis sits left of the plot: uPlot right-aligns its labels (the x axis's are centred)
        labels = sorted({d["text"] for d in drawn if d["chart"] == chart and d["align"] == "right"})
        units[chart], _ = _axis_values_ms(labels)
        assert page.locator(f'[data-metric="{chart}"]').locator("xpath=..").locator("figcaption").inner_text().count("ms") == 0
    assert units["ttft"] == "ms"
    if db == "edited":
        assert units["e2e"] == "s"
    assert page.js_errors == []


def test_chart_legends_give_durations_as_the_cards_do(web: WebServer, page: Any) -> None:
    series = httpx.get(web.url + "/api/overview", timeout=30).json()["series"]
    assert any(v >= 1000 for v in series["e2e"]["p99"] if v) and any(v < 1000 for v in series["e2e"]["p50"] if v)
    page.goto(web.url + "/")
    page.wait_for_selector('[data-metric="itl"] .uplot')
    for chart in LATENCY_CHARTS:
        over = page.locator(f'[data-metric="{chart}"] .u-over')
        box = over.bounding_box()
        for k in range(1, 10):
            page.mouse.move(box["x"] + box["width"] * k / 10, box["y"] + box["height"] / 2)
            legend = page.locator(f'[data-metric="{chart}"] .u-legend .u-series')
            for i, p in enumerate(("p50", "p90", "p95", "p99"), start=1):
                shown = legend.nth(i).locator(".u-value").inner_text()
                assert shown in {ms(v) for v in series[chart][p] if v is not None}, (chart, p, shown)
    assert page.js_errors == []


def _kept_traces(web: WebServer) -> list[dict[str, Any]]:
    out = []
    for r in web.requests:
        if r.stalled:
            trace = httpx.get(f"{web.url}/api/trace/{r.trace_id}", timeout=30).json()
            if trace["span_count"]:
                out.append(trace)
    return out


@pytest.fixture(scope="module")
def stalled_traces(web: WebServer) -> list[dict[str, Any]]:
    """Gives a kept stalled trace under 1 s and one of 1 s or more."""
    kept = _kept_traces(web)
    short = next(t for t in kept if t["duration_ms"] < 1000)
    long = next(t for t in kept if t["duration_ms"] >= 1000)
    return [short, long]


def _round_step(values: list[float]) -> None:
    """Checks that the ticks start at 0 and step by 1, 2, 2.5 or 5 times a power of ten."""
    assert values[0] == 0, values
    step = values[1] - values[0]
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, f) for f in (1, 2, 2.5, 5)), values
    assert all(math.isclose(v, k * step, abs_tol=1e-6) for k, v in enumerate(values)), values


@pytest.mark.parametrize("which", [0, 1], ids=["under-1s", "over-1s"])
def test_trace_offset_axes_say_one_unit_at_round_offsets(
    web: WebServer, stalled_traces: list[dict[str, Any]], which: int, page: Any
) -> None:
    trace = stalled_traces[which]
    page.goto(f"{web.url}/trace/{trace['trace_id']}")
    axes = {
        "timeline": (page.locator("section.request .tl-axis").first, trace["requests"][0]["timeline"]["duration_ms"]),
        "waterfall": (page.locator(".wf-head .wf-axis"), trace["duration_ms"]),
    }
    for name, (axis, total) in axes.items():
        labels = axis.locator("span").all_inner_texts()
        unit, values = _axis_values_ms(labels)
        assert unit == ("s" if max(values) >= 1000 else "ms"), (name, labels)
        assert len(values) >= 4 and max(values) <= total, (name, labels, total)
        _round_step(values)
        # each label sits at its offset: centred on it, the one at 0 starting there
        box = axis.bounding_box()
        for i, label in enumerate(axis.locator("span").all()):
            b = label.bounding_box()
            x = b["x"] if i == 0 else b["x"] + b["width"] / 2
            assert x == pytest.approx(box["x"] + values[i] / total * box["width"], abs=1.5), (name, labels[i])
            assert b["x"] + b["width"] <= box["x"] + box["width"] + 0.5, (name, labels[i], "sticks out")
    assert page.js_errors == []


def test_trace_durations_read_like_its_cards(web: WebServer, stalled_traces: list[dict[str, Any]], page: Any) -> None:
    for trace in stalled_traces:
        page.goto(f"{web.url}/trace/{trace['trace_id']}")
        e2e_card = page.locator("table.kv.inline th", has_text="E2E").locator("xpath=following-sibling::td[1]").inner_text()
        assert e2e_card == ms(trace["requests"][0]["summary"]["e2e_ms"])
        # the client span is the whole request: its bar says what the E2E card says
        client = page.locator(".wf-row", has_text="tokentrace.client").locator(".wf-dur").inner_text()
        assert client == e2e_card
        bar_labels = page.locator(".wf-dur").all_inner_texts()
        assert len(bar_labels) == trace["span_count"]
        assert all(re.fullmatch(CARD, t) for t in bar_labels), bar_labels
        # the timeline's tooltips: stalls, tokens, client chunks, engine steps
        titles = page.locator("svg.timeline title").all_text_contents()
        assert any(t.startswith("stall") for t in titles) and any(t.startswith("step") for t in titles)
        for title in titles:
            durations = re.findall(r"[\d,.]+ m?s\b", title)
            assert durations and all(re.fullmatch(CARD, d) for d in durations), title
    assert page.js_errors == []


def test_the_pages_duration_formatter_agrees_with_the_cards(web: WebServer, page: Any) -> None:
    # app.js's one formatter, run by Chromium on values around every rounding edge, against web/_format.py
    source = httpx.get(web.url + "/static/app.js", timeout=30).text
    block = re.search(r"var duration = \(function \(\) \{.*?\n  \}\)\(\);", source, re.S)
    assert block, "app.js has no `duration` formatter"
    edges = [0, 0.05, 0.125, 2.5, 12.345, 147.25, 318.45, 999.4999, 999.5, 999.94, 999.95, 999.97, 1000, 1999.995, 1234567.891]
    values = [(v, d) for v in edges for d in (0, 1, 2, 3)]
    values += [(k / 4, 1) for k in range(0, 12000, 7)] + [(k / 100, 2) for k in range(0, 300000, 997)]
    shown = page.evaluate(f"values => {{ {block[0]} return values.map(([v, d]) => duration.text(v, d)); }}", values)
    assert [(v, d, s) for (v, d), s in zip(values, shown, strict=True) if s != ms(v, d)] == []


def test_trace_bucket_parts_read_like_every_other_duration_and_share(
    web: WebServer, emitters: tuple[str, dict[str, str]], stalled_traces: list[dict[str, Any]], page: Any
) -> None:
    """The trace page's buckets and queue parts (`queue_wait`, `tokenize`, `other`): each
    duration as the cards give it (`ms`), each share as every share on the pages (`pct`:
    one decimal, "3.6 %", not "3.62 %"), and a part not measured "—" alone, never "0.0 %":
    the network without a client span, and vLLM's tokenize (vLLM reports no tokenize time)."""
    from tokentrace.web._format import pct

    parts = ("network", "queue_wait", "tokenize", "other", "prefill", "decode")
    url, ids = emitters  # vLLM: no client span, so network was not measured
    traces = [(web.url, t["trace_id"]) for t in stalled_traces] + [(url, ids["with_count"])]
    for base, trace_id in traces:
        summary = httpx.get(f"{base}/api/trace/{trace_id}", timeout=30).json()["requests"][0]["summary"]
        page.goto(f"{base}/trace/{trace_id}")
        names = page.locator("table.kv.buckets th").all_inner_texts()
        cells = page.locator("table.kv.buckets td").all_inner_texts()
        assert [n.strip() for n in names] == list(parts)
        unmeasured = {"tokenize"} if summary["source"] == "vllm" else set()
        expected = []
        for part in parts:
            value = None if part in unmeasured else summary[f"{part}_ms"]
            expected.append(ms(value) if value is None else f"{ms(value)} {pct(value / summary['e2e_ms'])}")
        assert [c.strip() for c in cells] == expected, (trace_id, cells)
        if summary["source"] == "vllm":
            assert cells[parts.index("tokenize")].strip() == "—", cells
        titles = page.locator(".bucketbar .seg").evaluate_all("els => els.map(e => e.title)")
        assert titles and all(re.fullmatch(rf"\w+: (?:{CARD}) \(\d+\.\d %\)", t) for t in titles), titles
    assert page.js_errors == []
