"""Headless Chromium against the real server: every page renders, clicks lead overview → finding → trace.

Screenshots land in the test's tmp dir (`pytest --basetemp=...` to keep them).
"""

from __future__ import annotations

import re
from itertools import islice
from pathlib import Path
from typing import Any

import httpx
import pytest
from tracegen import VLLM_OUTPUT_TOKENS, XSS_ATTR, XSS_NAME
from web_testkit import BROWSER_MARKS, WebServer

pytestmark = BROWSER_MARKS


def _shot(page: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    return path


def test_overview_draws_charts_and_links_through_to_a_trace(web: WebServer, page: Any, tmp_path: Path) -> None:
    page.goto(web.url + "/")
    page.wait_for_selector(".uplot")
    assert page.locator(".uplot").count() == 6  # four latency charts, rps, bucket shares
    _shot(page, tmp_path, "overview")
    findings = page.locator("a.finding-link")
    if findings.count():
        # overview → finding (on the diagnosis page) → one of its example traces
        findings.first.click()
        page.wait_for_url("**/diagnosis**")
        page.locator(".finding .trace-link").first.click()
    else:
        # no finding in this data: the path to a trace goes through search
        page.goto(web.url + "/search?sort=e2e_ms&order=desc")
        page.locator("a.trace-link").first.click()
    page.wait_for_url("**/trace/**")
    page.wait_for_selector("svg.timeline")
    assert page.locator(".bucketbar .seg").count() >= 3
    _shot(page, tmp_path, "trace-from-overview")
    assert page.js_errors == []


def test_search_sorts_and_pages(web: WebServer, page: Any, tmp_path: Path) -> None:
    page.goto(web.url + "/search?limit=20")
    assert page.locator("table.results tbody tr").count() == 20
    page.locator("a.sort", has_text="E2E").click()
    page.wait_for_url("**sort=e2e_ms**")
    values = page.locator("table.results tbody tr td:nth-child(3)").all_inner_texts()
    assert len(values) == 20
    page.locator("#next-page").click()
    page.wait_for_url("**after=**")
    assert page.locator("table.results tbody tr").count() == 20
    page.select_option("select[name=model]", "qwen-7b")
    page.locator("form.filters button").click()
    page.wait_for_url("**model=qwen-7b**")
    models = page.locator("table.results tbody tr td:nth-child(8)").all_inner_texts()
    assert models and set(models) == {"qwen-7b"}
    _shot(page, tmp_path, "search")
    assert page.js_errors == []


def test_a_bad_number_in_the_search_form_is_said_beside_the_form(web: WebServer, page: Any) -> None:
    page.goto(web.url + "/search")
    page.fill("input[name=start]", "2026-01-01T00:00:10Z")
    page.fill("input[name=min_e2e]", "fast")
    page.locator("form.filters button").click()
    page.wait_for_url("**min_e2e=fast**")
    assert page.locator("#search-error").inner_text() == "min_e2e must be a number of milliseconds, not 'fast'"
    assert page.input_value("input[name=min_e2e]") == "fast"
    assert page.input_value("input[name=start]") == "2026-01-01T00:00:10Z"
    # fixed in place, the search runs
    page.fill("input[name=min_e2e]", "300")
    page.locator("form.filters button").click()
    page.wait_for_url("**min_e2e=300**")
    assert page.locator("#search-error").count() == 0 and page.locator("table.results").count() == 1
    assert page.input_value("input[name=start]") == "2026-01-01T00:00:10Z"
    assert page.js_errors == []


def test_trace_waterfall_collapses_and_shows_details(web: WebServer, page: Any, tmp_path: Path) -> None:
    stalled = next(r for r in web.requests if r.stalled)
    target = stalled if _has_spans(web, stalled.trace_id) else web.requests[0]
    page.goto(f"{web.url}/trace/{target.trace_id}")
    rows = page.locator(".wf-row")
    assert rows.count() == 7
    request_row = page.locator(".wf-row", has_text="tokentrace.request").first
    request_row.locator(".toggle").click()
    assert page.locator(".wf-row:visible").count() == 2  # client + collapsed request span
    request_row.locator(".toggle").click()
    assert page.locator(".wf-row:visible").count() == 7
    request_row.click()
    detail = page.locator(".wf-detail:visible")
    assert detail.count() == 1 and "tokentrace.token.offsets_us" in detail.inner_text()
    _shot(page, tmp_path, "trace")
    assert page.js_errors == []


def test_kept_spans_without_token_times_say_so_not_zero_tokens(
    emitters: tuple[str, dict[str, str]], web: WebServer, page: Any, tmp_path: Path
) -> None:
    """vLLM's spans, kept whole, carry no per-token times: the timeline says what is known
    (the output token count, when sent) and that the emitter did not record the times,
    never "0 tokens" as if the request produced nothing."""
    url, ids = emitters
    for name, expected in (
        ("with_count", f"{VLLM_OUTPUT_TOKENS} output tokens; token times not recorded by this emitter (vllm) · 2.90 s"),
        ("without_count", "token times not recorded by this emitter (vllm) · 2.90 s"),
    ):
        page.goto(f"{url}/trace/{ids[name]}")
        summary = page.locator(".tl-summary").inner_text()
        assert not re.search(r"\b0 tokens?\b", summary) and "sampled out" not in summary, summary
        assert summary.startswith(expected), (name, summary)
        data = httpx.get(f"{url}/api/trace/{ids[name]}", timeout=30).json()  # the JSON twin says it too
        assert data["span_count"] == 1 and data["kept"], "the trace is kept whole"
        assert data["requests"][0]["token_times"] == "not_recorded"
        _shot(page, tmp_path, f"vllm-{name}")
    # the SDK's own spans still count their tokens
    kept = web.requests[0]  # an error: always kept
    page.goto(f"{web.url}/trace/{kept.trace_id}")
    assert page.locator(".tl-summary").inner_text().startswith(f"{len(kept.tokens_abs_ns)} tokens over ")
    assert page.js_errors == []


def test_diagnosis_page(web: WebServer, page: Any, tmp_path: Path) -> None:
    page.goto(web.url + "/diagnosis")
    assert page.locator("h1", has_text="Diagnosis").count() == 1
    assert page.locator("table.grid").count() == 2
    _shot(page, tmp_path, "diagnosis")
    assert page.js_errors == []


def test_injected_markup_in_spans_never_executes(web: WebServer, page: Any, tmp_path: Path) -> None:
    evil = web.requests[0]
    page.goto(f"{web.url}/trace/{evil.trace_id}")
    for row in page.locator(".wf-row").all():
        row.click()  # open every detail panel, so every attribute and event is in the DOM
    page.wait_for_timeout(200)
    assert page.dialogs == []
    assert page.locator("img[src=x]").count() == 0
    assert page.evaluate("document.querySelectorAll('script:not([src]):not([type=\"application/json\"])').length") == 0
    text = page.locator("body").inner_text()
    assert XSS_NAME in text and XSS_ATTR in text  # shown as text, verbatim
    _shot(page, tmp_path, "xss-trace")
    for path in ("/", "/search", "/diagnosis", f"/search?model={XSS_ATTR}", f"/search?tenant={XSS_NAME}"):
        page.goto(web.url + path)
        assert page.locator("img[src=x]").count() == 0
    assert page.locator("select[name=tenant] option:checked").inner_text() == XSS_NAME  # the filter shows, as text
    assert page.dialogs == []
    _shot(page, tmp_path, "xss-filter")


def _has_spans(web: WebServer, trace_id: str) -> bool:
    return bool(httpx.get(f"{web.url}/api/trace/{trace_id}", timeout=30).json()["span_count"])


def test_charts_tell_time_in_utc_like_the_rest_of_the_page(web: WebServer, browser: Any) -> None:
    # a browser in New York: the charts must not say 2025-12-31 7:00pm for 2026-01-01 00:00Z
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, timezone_id="America/New_York")
    try:
        page = context.new_page()
        page.goto(web.url + "/")
        page.wait_for_selector('[data-metric="e2e"] .uplot')
        over = page.locator('[data-metric="e2e"] .u-over')
        box = over.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        legend = page.locator('[data-metric="e2e"] .u-legend .u-series').first
        assert legend.locator(".u-label").inner_text() == "UTC"
        assert re.fullmatch(r"2026-01-01 00:00:\d\d", legend.locator(".u-value").inner_text())
    finally:
        context.close()


def test_y_axis_labels_are_not_cut_off(edited: WebServer, page: Any, tmp_path: Path) -> None:
    page.goto(edited.url + "/")  # E2E of 10 s and more: labels like "30,000"
    page.wait_for_selector('[data-metric="e2e"] .uplot')
    # uPlot draws the labels on a canvas; a label wider than its axis starts left of the canvas,
    # so its first columns of pixels hold ink
    ink = page.evaluate(
        """() => [...document.querySelectorAll('[data-chart] canvas')].map(c => {
             const d = c.getContext('2d').getImageData(0, 0, 2, c.height).data;
             return d.some((v, i) => i % 4 === 3 && v > 0);
           })"""
    )
    assert len(ink) == 6 and not any(ink)
    _shot(page, tmp_path, "overview-slow")
    assert page.js_errors == []


def test_applying_a_filter_keeps_the_others(web: WebServer, page: Any) -> None:
    start = min(r.start_ns for r in web.requests)
    for path in ("/", "/diagnosis", "/search"):
        page.goto(f"{web.url}{path}?start={start}&service=llm-server")
        page.select_option("select[name=model]", "qwen-7b")
        page.locator("form.filters button").click()
        page.wait_for_url("**model=qwen-7b**")
        assert f"start={start}" in page.url and "service=llm-server" in page.url, page.url
    assert page.js_errors == []


def test_requests_per_second_start_at_zero(web: WebServer, page: Any) -> None:
    import httpx

    rps = [v for v in httpx.get(web.url + "/api/overview", timeout=30).json()["series"]["rps"] if v]
    assert min(rps) > 0.5 * max(rps) > 0, "steady traffic: a y axis from its smallest value would magnify the swings"
    page.goto(web.url + "/")
    page.wait_for_selector('[data-chart="rps"] .uplot')
    # the line's ink in the plot area: its lowest pixel is the smallest rate, its highest the largest;
    # with the axis at 0 on the plot's bottom edge their heights above it are in the rates' ratio
    lo, hi, bottom = page.evaluate(
        """() => {
             const el = document.querySelector('[data-chart="rps"]');
             const canvas = el.querySelector('canvas'), over = el.querySelector('.u-over').getBoundingClientRect();
             const c = canvas.getBoundingClientRect(), k = canvas.width / c.width;
             const x0 = Math.round((over.left - c.left) * k), y0 = Math.round((over.top - c.top) * k);
             const w = Math.round(over.width * k), h = Math.round(over.height * k);
             const d = canvas.getContext('2d').getImageData(x0, y0, w, h).data;
             let top = null, low = null;
             for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) {
               const i = (y * w + x) * 4;  // the line is #1d232a, opaque; grid and fill are faint
               if (d[i + 3] > 200 && d[i] < 100 && d[i + 1] < 100 && d[i + 2] < 100) { if (top === null) top = y; low = y; }
             }
             return [low / k, top / k, h / k];
           }"""
    )
    assert lo is not None
    ratio = (bottom - lo) / (bottom - hi)
    assert ratio == pytest.approx(min(rps) / max(rps), abs=0.05), (lo, hi, bottom)
    assert page.js_errors == []


def _contrast(fg: str, bg: str) -> float:
    def luminance(css: str) -> float:
        rgb = [int(v) / 255 for v in re.findall(r"\d+(?:\.\d+)?", css)[:3]]
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    a, b = sorted((luminance(fg), luminance(bg)))
    return (b + 0.05) / (a + 0.05)


def test_waterfall_duration_labels_never_hide_their_bars(web: WebServer, page: Any, tmp_path: Path) -> None:
    import httpx

    kept = list(islice((r for r in web.requests if _has_spans(web, r.trace_id)), 4))  # asks until 4
    assert kept and web.requests[0] in kept  # the first is an error: its request span's bar is red
    inside = 0
    for r in kept:
        page.goto(f"{web.url}/trace/{r.trace_id}")
        rows = page.evaluate(
            """() => [...document.querySelectorAll('.wf-row')].map(row => {
                 const box = e => { const b = e.getBoundingClientRect(); return [b.left, b.right]; };
                 const bar = row.querySelector('.wf-bar'), label = row.querySelector('.wf-dur');
                 const s = getComputedStyle(label);
                 return { name: row.innerText, track: box(row.querySelector('.wf-track')), bar: box(bar), label: box(label),
                          labelBg: s.backgroundColor, color: s.color, barBg: getComputedStyle(bar).backgroundColor };
               })"""
        )
        assert len(rows) == httpx.get(f"{web.url}/api/trace/{r.trace_id}", timeout=30).json()["span_count"]
        for row in rows:
            (tl, tr), (bl, br), (ll, lr) = row["track"], row["bar"], row["label"]
            assert tl - 0.5 <= ll and lr <= tr + 0.5, row  # whole inside the track: nothing clipped at the edge
            if lr <= bl + 0.5 or ll >= br - 0.5:
                continue  # beside its bar
            # on its bar: right-aligned at the bar's end, with no backing that would hide the bar under it,
            # in a colour that reads on the bar
            inside += 1
            assert bl - 0.5 <= ll and br - 6 <= lr <= br + 0.5, row
            assert row["labelBg"] == "rgba(0, 0, 0, 0)", row
            assert _contrast(row["color"], row["barBg"]) >= 4, row
    assert inside >= len(kept)  # every client span reaches the right edge, and spans its whole trace
    _shot(page, tmp_path, "waterfall-labels")
    assert page.js_errors == []


def test_gpu_utilization_has_a_scale(web: WebServer, page: Any, tmp_path: Path) -> None:
    stalled = next(r for r in web.requests if r.stalled)
    page.goto(f"{web.url}/trace/{stalled.trace_id}")
    section = page.locator("section.request").first
    assert section.locator("polyline.gpu").count() == 1
    scale = section.locator(".tl-scale")
    assert scale.count() == 1, "the GPU line has no scale"
    assert "GPU util" in scale.inner_text()
    svg = section.locator("svg.timeline").bounding_box()
    inner = svg["height"] - 2  # the view box's 150 units fill the svg inside its 1 px border

    def y_of(util: float) -> float:  # where the template draws a utilization (polyline y = 146 - 0.4 × util)
        return svg["y"] + 1 + (146 - 0.4 * util) * inner / 150

    for text, util in (("100 %", 100), ("0 %", 0)):
        label = scale.get_by_text(text, exact=True).bounding_box()
        assert label["y"] + label["height"] / 2 == pytest.approx(y_of(util), abs=2), text
        assert label["x"] + label["width"] <= svg["x"], f"{text} sits beside the timeline, not over it"
    _shot(page, tmp_path, "gpu-scale")
    assert page.js_errors == []
