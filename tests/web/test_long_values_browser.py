"""Headless Chromium: a value of 20,000 characters without a space keeps every page the window's width.

A 100 KB model made the search page 5.5 million pixels wide and its trace page 1.47 million;
long values now wrap where they are shown, and a result's text cells end in an ellipsis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from web_testkit import BROWSER_MARKS, HostileServer

pytestmark = BROWSER_MARKS

WIDTH = 1400


def test_long_values_keep_every_page_the_windows_width(hostile: HostileServer, page: Any, tmp_path: Path) -> None:
    long = next(t for t in hostile.traces if t.payload_name == "long")
    paths = ("/", "/search", "/search?sort=model&order=asc", "/diagnosis", f"/trace/{long.trace_id}")
    for path in paths:
        assert page.goto(hostile.url + path).status == 200
        if path.startswith("/trace/"):
            for row in page.locator(".wf-row").all():
                row.click()  # every span's details open: attributes, events, links
            for details in page.locator("details").all():
                details.evaluate("d => d.open = true")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= WIDTH, (path, width)
        page.screenshot(path=str(tmp_path / f"long{path.replace('/', '_')}.png"))
    # a result's model cell shows the start of the value, cut by an ellipsis, on one line
    page.goto(hostile.url + "/search?sort=model&order=asc")
    cell = page.locator("table.results td.text", has_text="LLLL").first
    box = cell.bounding_box()
    assert box is not None and box["width"] < 300 and box["height"] < 40
    assert cell.evaluate("td => getComputedStyle(td).textOverflow") == "ellipsis"
    assert page.js_errors == []
