"""What the second newcomer review misread, in headless Chromium: colours and legends.

- The waterfall drew tokentrace's phase spans in shades of blue while the bucket bar above it
  gives queue orange, decode green: one colour per bucket on the page.
- The share chart's legend ran decode → network where the cards run network → decode.
- A legend's "latest bin" gave p50 = p90 = p95 = p99 for a bin of one request without saying
  it held one request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from web_testkit import BROWSER_MARKS, WebServer

pytestmark = BROWSER_MARKS

BUCKETS = ("network", "queue", "prefill", "decode")


def _kept_trace(web: WebServer) -> str:
    for r in web.requests:
        if r.stalled and httpx.get(f"{web.url}/api/trace/{r.trace_id}", timeout=30).json()["span_count"]:
            return r.trace_id
    raise AssertionError("no kept stalled trace")


def test_phase_spans_take_their_buckets_colour(web: WebServer, page: Any, tmp_path: Path) -> None:
    page.goto(f"{web.url}/trace/{_kept_trace(web)}")
    background = "e => getComputedStyle(e).backgroundColor"
    # the request's bucket bar: each part's colour (queue by its parts, as the table under it)
    seg = {
        part: page.locator(f".bucketbar .seg.p-{part}").first.evaluate(background)
        for part in ("network", "queue_wait", "tokenize", "other", "prefill", "decode")
    }
    assert len(set(seg.values())) == 6, seg
    # each span's bar colour by its name (the row reads "service name")
    bars = page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('.wf-row')].map(row =>
             [row.querySelector('.wf-name').innerText.trim().split(/\\s+/).pop(),
              getComputedStyle(row.querySelector('.wf-bar')).backgroundColor]))"""
    )
    assert set(bars) == {"tokentrace.client", "tokentrace.request", "tokentrace.tokenize", "tokentrace.queue",
                         "tokentrace.prefill", "tokentrace.decode", "tokentrace.detokenize"}, bars  # fmt: skip
    assert bars["tokentrace.queue"] == seg["queue_wait"]
    assert bars["tokentrace.tokenize"] == seg["tokenize"]
    assert bars["tokentrace.detokenize"] == seg["other"]
    assert bars["tokentrace.prefill"] == seg["prefill"] and bars["tokentrace.decode"] == seg["decode"]
    # the client span is the user's side: the network's colour; the request span is no bucket
    assert bars["tokentrace.client"] == seg["network"]
    assert bars["tokentrace.request"] not in seg.values()
    # and a legend says so, in the swatches' colours
    legend = page.locator("#phase-legend")
    assert legend.is_visible() and "bucket's colour" in legend.inner_text()
    assert legend.locator(".sw.p-prefill").evaluate(background) == seg["prefill"]
    page.locator("#waterfall").screenshot(path=str(tmp_path / "waterfall-colours.png"))
    assert page.js_errors == []


def test_share_legend_runs_in_the_cards_order_and_legends_count_the_bins_requests(
    web: WebServer, page: Any, tmp_path: Path
) -> None:
    page.goto(web.url + "/")
    page.wait_for_selector('[data-chart="share"] .uplot')
    cards = page.locator(".card", has_text="share of time").locator("th").all_inner_texts()
    assert [c.strip() for c in cards] == list(BUCKETS)
    share = page.locator('[data-chart="share"] .u-legend .u-series .u-label').all_inner_texts()
    assert share[1:] == list(BUCKETS), share
    series = httpx.get(web.url + "/api/overview", timeout=30).json()["series"]
    assert len(series["n"]) == len(series["t"]) and sum(series["n"]) == 120
    latest = max(i for i, n in enumerate(series["n"]) if n)
    for chart in ('[data-metric="e2e"]', '[data-metric="itl"]', '[data-chart="share"]'):
        count = page.locator(f"{chart} .u-legend tr.u-count")
        assert count.count() == 1, chart
        assert count.locator("th").inner_text() == "requests", chart
        assert count.locator(".u-value").inner_text() == str(series["n"][latest]), chart
    # the count follows the pointer, as the percentiles beside it do
    over = page.locator('[data-metric="e2e"] .u-over')
    box = over.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 3, box["y"] + box["height"] / 2)
    when = page.locator('[data-metric="e2e"] .u-legend .u-series').first.locator(".u-value").inner_text()
    shown = page.locator('[data-metric="e2e"] .u-legend tr.u-count .u-value').inner_text()
    idx = page.evaluate(
        """(when) => { const s = JSON.parse(document.getElementById('series').textContent);
             return s.t.findIndex(t => new Date(t * 1000).toISOString().slice(0, 19).replace('T', ' ') === when); }""",
        when,
    )
    assert idx >= 0 and shown == str(series["n"][idx]), (when, shown)
    page.screenshot(path=str(tmp_path / "overview-legends.png"), full_page=True)
    assert page.js_errors == []


def test_a_one_bin_window_says_how_many_requests_its_legend_is_over(one_slice: WebServer, page: Any) -> None:
    page.goto(one_slice.url + "/")
    page.wait_for_selector('[data-chart="share"] .uplot')
    count = page.locator('[data-metric="ttft"] .u-legend tr.u-count')
    assert count.locator("th").inner_text() == "requests" and count.locator(".u-value").inner_text() == "5"
    assert page.js_errors == []
