"""Headless Chromium: a trace of thousands of spans loads light and collapses without a DOM query per span.

The waterfall rendered a hidden detail table per span up front (a 5,000-span trace: 5.9 MB,
205,000 DOM nodes), and collapsing a span queried the document for each descendant's detail
(O(n²): 3.1 s for the root). The details now travel as one JSON block and are built on a
row's first click; collapsing walks maps built once. Work is counted here, never wall time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from web_testkit import BROWSER_MARKS, MANY_SPANS, WebServer

pytestmark = BROWSER_MARKS

#: Counts the DOM queries the page makes (querySelector and querySelectorAll, on elements and the document).
QUERY_COUNTER = """
window.__queries = 0;
for (const proto of [Element.prototype, Document.prototype]) {
  for (const name of ['querySelector', 'querySelectorAll']) {
    const real = proto[name];
    proto[name] = function (...args) { window.__queries++; return real.apply(this, args); };
  }
}
"""


@pytest.fixture(scope="module")
def big_trace(many_spans: WebServer) -> str:
    """Gives the id of the trace with MANY_SPANS more spans."""
    with duckdb.connect(str(many_spans.db), read_only=True) as conn:
        row = conn.execute("SELECT trace_id FROM spans GROUP BY trace_id ORDER BY count(*) DESC LIMIT 1").fetchone()
    assert row is not None
    return str(row[0])


def test_a_big_trace_renders_no_hidden_detail_tables(many_spans: WebServer, big_trace: str, page: Any) -> None:
    html = httpx.get(f"{many_spans.url}/trace/{big_trace}", timeout=60).text
    assert html.count('class="wf-row') > MANY_SPANS
    assert 'class="wf-detail' not in html  # built on a row's first click, from the JSON block
    page.goto(f"{many_spans.url}/trace/{big_trace}")
    nodes = page.evaluate("document.getElementsByTagName('*').length")
    # a row is 7 elements; a hidden detail table made each ~40
    assert nodes < 10 * MANY_SPANS, nodes
    assert page.locator(".wf-detail").count() == 0
    assert page.js_errors == []


def test_collapsing_the_root_of_a_big_trace_queries_the_dom_a_bounded_number_of_times(
    many_spans: WebServer, big_trace: str, browser: Any, tmp_path: Path
) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_init_script(QUERY_COUNTER)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"{many_spans.url}/trace/{big_trace}")
        rows = page.locator(".wf-row")
        total = rows.count()
        request_row = page.locator(".wf-row", has_text="tokentrace.request").first
        # open a tool call's details first: collapsing must hide them with their row
        tool_row = page.locator(".wf-row", has_text="tool.call 7").first
        tool_row.click()
        assert page.locator(".wf-detail:visible").count() == 1
        assert "SELECT 7" in page.locator(".wf-detail:visible").inner_text()
        before = page.evaluate("window.__queries")
        request_row.locator(".toggle").click()
        collapsed = page.evaluate("window.__queries") - before
        # the old app.js queried the document once per descendant (thousands); now none per span
        assert collapsed < 50, collapsed
        visible = page.locator(".wf-row:visible").count()
        assert visible < total - MANY_SPANS and page.locator(".wf-detail:visible").count() == 0
        page.screenshot(path=str(tmp_path / "collapsed.png"))
        before = page.evaluate("window.__queries")
        request_row.locator(".toggle").click()
        assert page.evaluate("window.__queries") - before < 50
        assert page.locator(".wf-row:visible").count() == total
        # the reopened tool call's details stay closed until clicked again
        assert page.locator(".wf-detail:visible").count() == 0
        assert not tool_row.evaluate("r => r.classList.contains('selected')")
        tool_row.click()
        assert page.locator(".wf-detail:visible").count() == 1
        assert page.locator(".wf-detail").count() == 1  # built once, shown again
        assert errors == []
    finally:
        context.close()
