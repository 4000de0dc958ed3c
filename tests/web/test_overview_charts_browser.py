"""Headless Chromium: the overview's charts read right with little data, and nothing on a page looks missing.

A first try of the SDK sends a handful of requests within a second: one time bin.  The charts
must show that bin where it is (not a time axis over years with the points at its left edge),
and their legends must give values before anyone hovers ("p50: --" reads as missing data).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
from test_durations_browser import RECORD_CANVAS_TEXT
from web_testkit import BROWSER_MARKS, ONE_SLICE_COUNT, WebServer

from tokentrace.web._format import ms

pytestmark = BROWSER_MARKS
CHARTS = ("e2e", "ttft", "tpot", "itl", "rps", "share")


def _ink_columns(page: Any, chart: str) -> list[float]:
    """Gives the x of each column of the chart's plot area that holds opaque ink, as a fraction of its width."""
    selector = f'[data-metric="{chart}"]' if chart in ("e2e", "ttft", "tpot", "itl") else f'[data-chart="{chart}"]'
    return page.evaluate(
        """sel => {
             const el = document.querySelector(sel);
             const canvas = el.querySelector('canvas'), over = el.querySelector('.u-over').getBoundingClientRect();
             const c = canvas.getBoundingClientRect(), k = canvas.width / c.width;
             const x0 = Math.round((over.left - c.left) * k), y0 = Math.round((over.top - c.top) * k);
             const w = Math.round(over.width * k), h = Math.round(over.height * k);
             const d = canvas.getContext('2d').getImageData(x0, y0, w, h).data, out = [];
             for (let x = 0; x < w; x++) for (let y = 0; y < h; y++) {
               const i = (y * w + x) * 4;  // series ink is opaque and coloured; the grid is faint grey
               const grey = Math.max(d[i], d[i + 1], d[i + 2]) - Math.min(d[i], d[i + 1], d[i + 2]) < 12 && d[i] > 150;
               if (d[i + 3] > 200 && !grey) { out.push(x / w); break; }
             }
             return out;
           }""",
        selector,
    )


def test_one_time_slice_is_drawn_in_the_middle_of_an_axis_around_it(one_slice: WebServer, page: Any, tmp_path: Path) -> None:
    series = httpx.get(one_slice.url + "/api/overview", timeout=30).json()["series"]
    assert len(series["t"]) == 1 and series["rps"][0] * series["bin_s"] == ONE_SLICE_COUNT
    page.add_init_script(RECORD_CANVAS_TEXT)
    page.goto(one_slice.url + "/")
    page.wait_for_selector('[data-chart="share"] .uplot')
    note = page.locator("#one-slice")
    assert note.is_visible() and f"All {ONE_SLICE_COUNT} requests" in note.inner_text()
    # the x axes: the seconds around the bin, on its day (uPlot gave one time years: "2027-02 … 2029-08")
    drawn = page.evaluate("window.__drawn")
    for chart in CHARTS:
        labels = [d["text"] for d in drawn if d["chart"] == chart and d["align"] == "center"]
        assert labels, chart
        assert all(re.fullmatch(r":(29|30|31)|2026-01-01 01:30", t) for t in labels), (chart, labels)
        assert len([t for t in labels if t.startswith(":")]) <= 4, (chart, labels)
    # every chart draws the bin, in the middle of its axis: latency points, the rate's and shares' bars
    for chart in CHARTS:
        ink = _ink_columns(page, chart)
        assert ink, f"{chart}: nothing drawn"
        assert 0.2 < min(ink) and max(ink) < 0.8, (chart, min(ink), max(ink))
    path = tmp_path / "one-slice.png"
    page.screenshot(path=str(path), full_page=True)
    assert page.js_errors == []


def test_legends_show_the_latest_values_until_hovered(web: WebServer, page: Any) -> None:
    series = httpx.get(web.url + "/api/overview", timeout=30).json()["series"]
    page.goto(web.url + "/")
    page.wait_for_selector('[data-chart="share"] .uplot')
    values = page.locator(".u-legend .u-value").all_inner_texts()
    assert values and "--" not in values, values
    latest = max(i for i, n in enumerate(series["rps"]) if n)
    legend = page.locator('[data-metric="e2e"] .u-legend .u-series')
    assert legend.nth(0).locator(".u-value").inner_text().endswith("(latest)")
    for i, p in enumerate(("p50", "p90", "p95", "p99"), start=1):
        assert legend.nth(i).locator(".u-value").inner_text() == ms(series["e2e"][p][latest]), p
    share = page.locator('[data-chart="share"] .u-legend .u-series')
    shown = {share.nth(i).locator(".u-label").inner_text(): share.nth(i).locator(".u-value").inner_text() for i in range(1, 5)}
    assert shown == {b: f"{series['share'][b][latest] * 100:.1f} %" for b in ("network", "queue", "prefill", "decode")}
    # hovered, the legend follows the pointer: no "(latest)"
    box = page.locator('[data-metric="e2e"] .u-over').bounding_box()
    page.mouse.move(box["x"] + box["width"] / 3, box["y"] + box["height"] / 2)
    assert not legend.nth(0).locator(".u-value").inner_text().endswith("(latest)")
    assert page.js_errors == []


def test_unmeasured_network_is_a_dash_in_the_share_legend(one_slice: WebServer, page: Any) -> None:
    page.goto(one_slice.url + "/")
    page.wait_for_selector('[data-chart="share"] .uplot')
    share = page.locator('[data-chart="share"] .u-legend .u-series', has_text="network")
    assert share.locator(".u-value").inner_text() == "—"
    assert page.js_errors == []

