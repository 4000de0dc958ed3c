"""Headless Chromium on the trace page of a real vLLM stream under OpenLLMetry: the client's
chunks are drawn as the request's token times, with its stalls shaded over them, and the
client span's name (a script here) is shown as text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
from tracegen import XSS_NAME
from web_testkit import BROWSER_MARKS

pytestmark = BROWSER_MARKS
RECORDED = Path(__file__).resolve().parents[1] / "data" / "engines"

#: Elements no page of ours has: if one shows up, a payload became markup.
INJECTED = "script:not([src]):not([type='application/json']), img[src=x], [onerror], [onload]"


def test_the_timeline_draws_the_client_chunks_and_their_stalls(
    engine_recordings: tuple[str, Path], page: Any, tmp_path: Path
) -> None:
    url, db = engine_recordings
    conn = duckdb.connect(str(db), read_only=True)
    try:
        trace_id, stalls = conn.execute(
            "SELECT trace_id, stall_count FROM requests "
            "ORDER BY stall_count DESC NULLS LAST, trace_id LIMIT 1"
        ).fetchone()  # type: ignore[misc]
    finally:
        conn.close()
    measured = json.loads((RECORDED / "stutter.client.json").read_text())["requests"]
    # every chunk the client's code saw (the first carries only the role: 65 for 64 tokens)
    (chunks,) = [len(m["chunk_ms"]) for m in measured if m["trace_id"] == trace_id]
    page.goto(f"{url}/trace/{trace_id}")
    summary = page.locator(".tl-summary").inner_text()
    assert summary.startswith(f"{chunks} client chunks over "), summary
    assert XSS_NAME in page.locator(".tl-summary code.client-span").inner_text()  # as text
    assert page.locator("svg.timeline line.chunk").count() == chunks
    assert page.locator("svg.timeline line.tick").count() == 0
    assert page.locator("svg.timeline rect.stall").count() == stalls > 0
    assert page.locator(".tl-none.row-chunks").count() == 0  # no "no client chunks"
    assert "client's chunks below stand in" in page.locator(".tl-none.row-tokens").inner_text()
    assert page.locator("table.stalls th").first.inner_text() == "after chunk"
    assert page.locator("table.stalls tr").count() == stalls + 1
    # the ticks lie inside the plot, left to right
    ticks = page.locator("svg.timeline line.chunk")
    xs = [float(x) for x in ticks.evaluate_all("ls => ls.map(l => l.getAttribute('x1'))")]
    assert xs == sorted(xs) and 0 <= xs[0] and xs[-1] <= 1000
    assert page.locator(INJECTED).count() == 0 and page.dialogs == [] and page.js_errors == []
    page.screenshot(path=str(tmp_path / "client-chunks.png"), full_page=True)
