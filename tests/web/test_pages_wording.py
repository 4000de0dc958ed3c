"""What a newcomer misread on the pages and in the HTML report, and what they now say.

- The overview put a card's p95 over the whole window beside a legend's p95 of one time bin,
  and a chart of each request's median gap under the name "ITL" beside the ITL card (every gap).
- The HTML report drew a line across an idle stretch, had no times on its axis, hid e2e p95
  under p99, and dropped the buckets' p50/p99 and the queue's parts.
- The trace page's token timeline had unlabelled rows, a blank GPU row on a CPU server, and
  no queue total next to the queue's parts.
- An empty window read like a clean bill of health ("No findings … the complaint table"), and
  a misspelled complaint in search matched nothing without saying why.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jinja2
import markupsafe
import pytest
from tracegen import GeneratedRequest
from web_testkit import BROWSER_MARKS, WebServer, edited_copy

from tokentrace.analyzer.diagnosis import COMPLAINTS, TITLES
from tokentrace.analyzer.render import format_ms
from tokentrace.analyzer.render_html import COLORS, render_html
from tokentrace.web import _format
from tokentrace.web._format import ms, pct

pytestmark = BROWSER_MARKS
TEMPLATES = Path(_format.__file__).parent / "templates"


def _shot(page: Any, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def empty(generated: tuple[Path, list[GeneratedRequest]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    """A database that has received nothing yet."""
    yield from edited_copy(
        generated, tmp_path_factory, "webdb-empty",
        ("DELETE FROM requests", []), ("DELETE FROM spans", []), ("DELETE FROM kept_traces", []),
    )  # fmt: skip


@pytest.fixture(scope="module")
def cpu_only(generated: tuple[Path, list[GeneratedRequest]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    """The generated traffic served by a server without GPU metrics (a CPU server)."""
    yield from edited_copy(generated, tmp_path_factory, "webdb-cpu", ("DELETE FROM gpu_samples", []))


# --- 1. the overview: which number is over what --------------------------------------------------


def test_cards_say_whole_window_and_legends_say_latest_bin(web: WebServer, page: Any, tmp_path: Path) -> None:
    series = httpx.get(web.url + "/api/overview", timeout=30).json()["series"]
    page.goto(web.url + "/")
    page.wait_for_selector('[data-chart="share"] .uplot')
    # E2E, TTFT (server), TTFT (user: the generated traces have client spans), TPOT, ITL
    assert page.locator("[data-card]").count() == 5, "the cards do not say what they cover"
    for m in ("e2e", "ttft", "ttft_client", "tpot", "itl"):
        assert "whole window" in page.locator(f'[data-card="{m}"] h4').inner_text().lower(), m
    assert "every token gap" in page.locator('[data-card="itl"] h4').inner_text().lower()
    # the gap chart is named for what it draws, not "ITL": that name is the card's, over every gap
    caption = page.locator('[data-metric="itl"]').locator("xpath=..").locator("figcaption")
    title = caption.inner_text().splitlines()[0]
    assert not re.search(r"\bITL\b", title) and "median inter-token gap" in title.lower(), title
    latest = max(i for i, n in enumerate(series["rps"]) if n)
    for chart in ("e2e", "ttft", "tpot", "itl", "rps", "share"):
        sel = f'[data-metric="{chart}"]' if chart in ("e2e", "ttft", "tpot", "itl") else f'[data-chart="{chart}"]'
        label = page.locator(f"{sel} .u-legend .u-series").first.locator(".u-label")
        # off the chart: the legend's values are the latest bin's, and it says so in a badge
        assert label.inner_text() == "latest bin, UTC", chart
        assert label.evaluate("e => getComputedStyle(e).backgroundColor") not in ("rgba(0, 0, 0, 0)", "transparent")
    e2e = page.locator('[data-metric="e2e"] .u-legend .u-series')
    assert e2e.nth(3).locator(".u-value").inner_text() == ms(series["e2e"]["p95"][latest])
    _shot(page, tmp_path, "overview-latest-bin")
    # pointing at a bin: the legend is that bin's, the badge gone
    box = page.locator('[data-metric="e2e"] .u-over').bounding_box()
    page.mouse.move(box["x"] + box["width"] / 3, box["y"] + box["height"] / 2)
    assert e2e.first.locator(".u-label").inner_text() == "UTC"
    assert "at-latest" not in (page.locator('[data-metric="e2e"] .uplot').get_attribute("class") or "")
    assert page.js_errors == []


# --- 2. the HTML report ---------------------------------------------------------------------------

T0 = 1_795_309_955 * 10**9  # 2026-11-22 01:12:35Z
SLICE = 10**9


def _report() -> dict[str, Any]:
    """A report as build_report gives it: busy slices, 14 idle ones, then a lone slice and two more."""
    busy = [0, 1, 2, 3, 4, 19, 21, 22]
    points = [
        {"start_ns": T0 + i * SLICE, "requests": 10, "e2e_p50": 1000.0 + i * 10, "e2e_p95": 5000.0 + i * 10,
         "e2e_p99": 5000.0 + i * 10, "ttft_p50": 500.0, "ttft_p95": 900.0, "queue_share": 0.5}
        for i in busy
    ]  # fmt: skip
    pcts = {"p50": 100.0, "p90": 200.0, "p95": 300.0, "p99": 400.0}
    buckets: dict[str, Any] = {
        "network": {"p50": 102.472, "p90": 1, "p95": 1, "p99": 532.048, "share": 0.0297, "measured": True},
        "queue": {"p50": 3174.25, "p90": 1, "p95": 1, "p99": 10943.158, "share": 0.733,
                  "parts": {"queue_wait": 0.9989, "tokenize": 0.0003, "other": 0.0008}},
        "prefill": {"p50": 38.309, "p90": 1, "p95": 1, "p99": 305.048, "share": 0.0136},
        "decode": {"p50": 764.605, "p90": 1, "p95": 1, "p99": 3608.21, "share": 0.2236},
    }  # fmt: skip
    return {
        "window": {"start_ns": T0, "end_ns": T0 + 22 * SLICE, "filters": {}},
        "requests": {"count": 80, "kept_traces": 3, "errors": 0, "with_client_span": 80},
        "latency": {k: pcts for k in ("e2e", "ttft", "ttft_client", "tpot", "itl")},
        "buckets": buckets,
        "findings": [],
        "timeline": {"slice_ns": SLICE, "points": points},
        "itl_histogram": [{"le_ms": 5.0, "count": 10}],
    }


def _lines(page: str) -> list[tuple[str, str, list[float]]]:
    """Gives each polyline of the latency chart: its stroke, its attributes, its x coordinates."""
    chart = page[: page.index('aria-label="bucket shares"')]
    out = []
    for attrs in re.findall(r"<polyline ([^>]*)/?>", chart):
        stroke = re.search(r'stroke="([^"]+)"', attrs).group(1)  # type: ignore[union-attr]
        points = re.search(r'points="([^"]+)"', attrs).group(1)  # type: ignore[union-attr]
        out.append((stroke, attrs, [float(p.split(",")[0]) for p in points.split()]))
    return out


def test_html_report_breaks_lines_at_empty_slices_and_labels_its_time_axis(tmp_path: Path) -> None:
    report = _report()
    page = render_html(report)
    (tmp_path / "report.html").write_text(page)
    lines = _lines(page)
    assert lines
    # the plot spans 22 slices: a line joins neighbouring slices only, never across the idle 14
    xs = sorted({x for _, _, pts in lines for x in pts})
    per_slice = (xs[-1] - xs[0]) / 22
    for stroke, _, pts in lines:
        steps = [b - a for a, b in zip(pts, pts[1:], strict=False)]
        assert all(s <= per_slice * 1.01 for s in steps), (stroke, steps)
    # the lone slice between gaps (19) is a dot
    assert page.count("<circle") >= 3
    # the axis says when: the first slice's start with its date, and the last one's, in UTC
    assert "2026-11-22 01:12:35 UTC" in page and "01:12:57 UTC" in page
    assert "+0.4 min" not in page


def test_html_report_keeps_p95_apart_from_p99() -> None:
    page = render_html(_report())  # p95 == p99 in every slice: drawn alike, one would hide the other
    lines = _lines(page)
    p95 = [i for i, (stroke, _, _) in enumerate(lines) if stroke == COLORS["e2e_p95"]]
    p99 = [i for i, (stroke, _, _) in enumerate(lines) if stroke == COLORS["e2e_p99"]]
    assert p95 and p99
    assert all("stroke-dasharray" in lines[i][1] for i in p95), "p95 is drawn as p99 is"
    assert min(p95) > max(p99), "p95 is drawn under p99"


def test_html_report_gives_each_buckets_p50_p99_and_the_queues_parts() -> None:
    report = _report()
    page = render_html(report)
    section = page[page.index("<h2>Where the time goes</h2>") : page.index("<h2>Inter-token gaps</h2>")]
    for b, bucket in report["buckets"].items():
        row = re.search(rf"<tr><th>[^\n]*?{b}</th>(.*?)</tr>", section)
        assert row, b
        cells = re.findall(r"<td>([^<]*)</td>", row.group(1))
        assert cells == [f"{bucket['share'] * 100:.1f} %", format_ms(bucket["p50"]), format_ms(bucket["p99"])], (b, cells)
    assert "queue = queue_wait 99.9 %, tokenize 0.0 %, other 0.1 %" in section
    # network without client spans: said, not 0
    report["buckets"]["network"]["measured"] = False
    assert re.search(r"network</th><td>not measured</td>", render_html(report))


# --- 3. the trace page's token timeline -----------------------------------------------------------

ROWS = {"server tokens": 22, "client chunks": 51, "its engine steps": 73, "other steps": 91, "GPU util": 126}


def _stalled_kept(server: WebServer) -> str:
    for r in server.requests:
        if r.stalled and httpx.get(f"{server.url}/api/trace/{r.trace_id}", timeout=30).json()["span_count"]:
            return r.trace_id
    raise AssertionError("no kept stalled trace")


def test_timeline_rows_are_labelled_at_their_left(web: WebServer, page: Any, tmp_path: Path) -> None:
    page.goto(f"{web.url}/trace/{_stalled_kept(web)}")
    section = page.locator("section.request").first
    svg = section.locator("svg.timeline").bounding_box()
    inner = svg["height"] - 2
    scale = section.locator(".tl-scale")
    assert scale.get_by_text("server tokens", exact=True).count() == 1, "the rows are not labelled"
    for text, y in ROWS.items():
        label = scale.get_by_text(text, exact=True).bounding_box()
        assert label is not None, text
        # beside its row: centred on it, left of the timeline
        assert label["y"] + label["height"] / 2 == pytest.approx(svg["y"] + 1 + y * inner / 150, abs=2), text
        assert label["x"] + label["width"] <= svg["x"], text
        assert label["x"] >= scale.bounding_box()["x"] - 0.5, f"{text} is cut off at the left"
    assert section.locator(".tl-none").count() == 0  # every row has something to draw
    _shot(page, tmp_path, "timeline-rows")
    assert page.js_errors == []


def test_a_cpu_server_says_no_gpu_samples(cpu_only: WebServer, page: Any, tmp_path: Path) -> None:
    trace_id = _stalled_kept(cpu_only)
    trace = httpx.get(f"{cpu_only.url}/api/trace/{trace_id}", timeout=30).json()
    assert trace["requests"][0]["timeline"]["gpu"] == [] and trace["requests"][0]["timeline"]["stalls"]
    page.goto(f"{cpu_only.url}/trace/{trace_id}")
    section = page.locator("section.request").first
    note = section.locator(".tl-none.no-gpu")
    assert note.is_visible() and note.inner_text().startswith("no GPU samples")
    # over the GPU row, inside the timeline
    svg, box = section.locator("svg.timeline").bounding_box(), note.bounding_box()
    assert box["y"] + box["height"] / 2 == pytest.approx(svg["y"] + 1 + 126 * (svg["height"] - 2) / 150, abs=2)
    assert svg["x"] <= box["x"] and box["x"] + box["width"] <= svg["x"] + svg["width"]
    gpu_cells = section.locator("table.stalls tr td:last-child").all_inner_texts()
    assert gpu_cells and all(c.strip() == "no GPU samples" for c in gpu_cells), gpu_cells
    _shot(page, tmp_path, "timeline-cpu")
    assert page.js_errors == []


def test_the_queue_total_spans_its_parts(web: WebServer, page: Any, tmp_path: Path) -> None:
    trace_id = _stalled_kept(web)
    summary = httpx.get(f"{web.url}/api/trace/{trace_id}", timeout=30).json()["requests"][0]["summary"]
    page.goto(f"{web.url}/trace/{trace_id}")
    assert page.locator(".queue-total").count() == 1, "no queue total"
    total = page.locator(".queue-total").first
    text = " ".join(total.inner_text().split())
    assert text.startswith(f"queue {ms(summary['queue_ms'])} {pct(summary['queue_ms'] / summary['e2e_ms'])}"), text
    assert "queue_wait + tokenize + other" in text
    # above the three parts' columns, from the first's left to the last's right
    heads = {h.inner_text().strip(): h.bounding_box() for h in page.locator("table.kv.buckets").first.locator("th").all()}
    box = total.bounding_box()
    assert box["x"] == pytest.approx(heads["queue_wait"]["x"], abs=3)
    assert box["x"] + box["width"] == pytest.approx(heads["other"]["x"] + heads["other"]["width"], abs=3)
    assert box["y"] + box["height"] <= heads["queue_wait"]["y"] + 1
    _shot(page, tmp_path, "queue-total")
    assert page.js_errors == []


# --- 4. empty states and a misspelled complaint ---------------------------------------------------


def test_an_empty_database_says_no_requests_and_where_to_send_them(empty: WebServer, page: Any, tmp_path: Path) -> None:
    for path in ("/", "/diagnosis"):
        page.goto(empty.url + path)
        text = page.locator("main").inner_text()
        assert "No requests yet" in text, path
        assert ":4318/v1/traces" in text and ":4317" in text, text
        # nothing else: no findings verdict, no cards or tables of dashes
        assert "finding" not in text.lower() and "complaint table" not in text, text
        assert page.locator(".cards, table.grid, .charts").count() == 0, path
        _shot(page, tmp_path, "empty" + path.replace("/", "-"))
    assert page.js_errors == []


def test_a_window_without_requests_says_so_and_how_to_widen_it(web: WebServer, page: Any) -> None:
    page.goto(web.url + "/?service=no-such-service")
    text = page.locator("main").inner_text()
    assert "No requests in this window with these filters" in text
    assert "finding" not in text.lower() and page.locator(".cards").count() == 0
    newest = httpx.get(web.url + "/api/overview", params={"service": "no-such-service"}, timeout=30).json()["range"]["newest_ns"]
    assert f"The newest request in the database started at {_format.when(newest)}" in text
    page.locator("#widen").click()
    page.wait_for_selector(".cards")
    assert page.js_errors == []


def _findings_html(**context: Any) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True)
    _format.install(env)
    return env.get_template("_findings.html").render(filters={}, detail=False, services=1, **context)


def test_no_findings_names_what_was_checked_in_plain_words() -> None:
    html = _findings_html(findings=[], count=500)
    assert "complaint table" not in html
    assert "No latency problem found" in html
    for c in COMPLAINTS:  # every check, by what it looks for
        assert str(markupsafe.escape(TITLES[c])) in html, c
    few = _findings_html(findings=[], count=5)
    assert "Too few requests for a diagnosis" in few and "No latency problem" not in few
    # while the diagnosis is still computing, no verdict at all
    pending = _findings_html(findings=[], count=500, pending=True)
    assert "No latency problem" not in pending and "No findings" not in pending


def test_a_few_requests_are_too_few_for_a_diagnosis_not_healthy(one_slice: WebServer, page: Any) -> None:
    page.goto(one_slice.url + "/")
    text = page.locator("main").inner_text()
    assert "Too few requests for a diagnosis: 5 requests in this window" in text
    assert "complaint table" not in text


def test_the_complaint_filter_is_a_choice_and_a_typo_is_named(web: WebServer, page: Any, tmp_path: Path) -> None:
    unknown = f"unknown complaint 'stuter': one of {', '.join(COMPLAINTS)}"
    api = httpx.get(web.url + "/api/search", params={"complaint": "stuter"}, timeout=60).json()
    assert api["note"] == unknown and api["rows"] == []
    page.goto(web.url + "/search?complaint=stuter")
    assert page.locator("#search-note").inner_text() == unknown
    select = page.locator("select[name=complaint]")
    assert select.count() == 1
    values = select.locator("option").evaluate_all("os => os.map(o => o.value)")
    assert values == ["", "stuter", *COMPLAINTS]  # what was asked stays shown, marked unknown
    assert select.locator("option:checked").inner_text() == "stuter (unknown)"
    _shot(page, tmp_path, "search-unknown-complaint")
    # a valid choice finds its finding's requests
    findings = httpx.get(web.url + "/api/diagnosis", timeout=60).json()["report"]["findings"]
    assert findings
    select.select_option(findings[0]["complaint"])
    page.locator("form.filters button").click()
    page.wait_for_url(f"**complaint={findings[0]['complaint']}**")
    assert page.locator("#search-note").count() == 0
    assert page.locator("table.results a.trace-link").count() > 0
    assert page.js_errors == []
