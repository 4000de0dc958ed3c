"""Headless Chromium against the real server: every page renders, clicks lead overview → finding → trace.

Screenshots land in the test's tmp dir (`pytest --basetemp=...` to keep them).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tracegen import XSS_ATTR, XSS_NAME
from web_testkit import WebServer

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's /usr/bin/chromium"),
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    dialogs: list[str] = []
    errors: list[str] = []
    pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.dialogs = dialogs
    pg.js_errors = errors
    try:
        yield pg
    finally:
        context.close()


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
    import httpx

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
