"""The diagnosis page says what the window's traces could show and what not (issue 22): the
signals they carried, the complaints they could not check with what to add, and the traces
that matched no convention, by root span; the "nothing found" list names only what it checked."""

from __future__ import annotations

import html
import shutil
from collections.abc import Iterator
from pathlib import Path

import duckdb
import httpx
import pytest
from tracegen import GeneratedRequest, generate
from tt_testkit import explorer
from web_testkit import WebServer

from tokentrace.analyzer.summary import RequestSummary
from tokentrace.collector.writer import WriteBatch, Writer
from tokentrace.store.connection import open_db


def _get(server: WebServer, path: str) -> httpx.Response:
    r = httpx.get(server.url + path, timeout=120)
    assert r.status_code == 200, (path, r.status_code, r.text[:300])
    return r


def _unmatched_rows(conn: duckdb.DuckDBPyConnection, n: int, start_ns: int) -> None:
    for i in range(n):
        conn.execute(
            "INSERT INTO unmatched_traces (trace_id, start_ns, service, root_name, span_count) VALUES (?, ?, 'my-app', ?, 3)",
            [f"{i:032x}", start_ns + i, "llm.request" if i % 3 else "GET /health"],
        )


@pytest.fixture(scope="module")
def unmatched(generated: tuple[Path, list[GeneratedRequest]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    """A copy of the generated database with six traces of custom spans beside its requests."""
    src, requests = generated
    db = tmp_path_factory.mktemp("webdb-unmatched") / "web.duckdb"
    shutil.copy(src, db)
    conn = duckdb.connect(str(db))
    try:
        (first,) = conn.execute("SELECT min(start_ns) FROM requests").fetchone()  # type: ignore[misc]
        _unmatched_rows(conn, 6, first)
    finally:
        conn.close()
    with explorer(db) as url:
        yield WebServer(url, db, requests)


@pytest.fixture(scope="module")
def only_custom_spans(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    """A database of traces no convention reads: no request row at all."""
    tmp = tmp_path_factory.mktemp("webdb-custom-only")
    db, _ = generate(tmp, count=1, evil=False)
    conn = duckdb.connect(str(db))
    try:
        conn.execute("DELETE FROM requests")
        _unmatched_rows(conn, 4, 1_700_000_000 * 10**9)
    finally:
        conn.close()
    with explorer(db) as url:
        yield WebServer(url, db, [])


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    """A healthy window of 60 requests (one a second, all alike) with no token times."""
    db = tmp_path_factory.mktemp("webdb-quiet") / "web.duckdb"
    writer = Writer(open_db(db))
    rows = [
        RequestSummary(
            f"{i:032x}", f"req-{i}", 1_700_000_000 * 10**9 + i * 10**9, e2e_ms=500.0, queue_ms=5.0,
            prefill_ms=50.0, decode_ms=445.0, server_ms=500.0, other_ms=5.0, ttft_ms=55.0,
            prompt_tokens=100, output_tokens=40, model="m", service="llm", source="vllm",
        )
        for i in range(60)
    ]
    assert writer.submit_wait(WriteBatch(requests=rows))
    writer.close()
    writer._conn.close()
    with explorer(db) as url:
        yield WebServer(url, db, [])


def test_the_diagnosis_page_says_what_could_not_be_checked(unmatched: WebServer) -> None:
    report = _get(unmatched, "/api/diagnosis").json()["report"]
    coverage = report["coverage"]
    assert len(coverage["complaints"]) == 10
    assert coverage["unmatched_traces"] == {
        "count": 6, "roots": [{"name": "llm.request", "count": 4}, {"name": "GET /health", "count": 2}],
    }  # fmt: skip
    page = html.unescape(_get(unmatched, "/diagnosis").text)
    assert '<section class="coverage" id="coverage">' in page
    assert "signals: token times" in page
    for c in coverage["complaints"]:
        if not c["checkable"]:
            assert f'<li id="unchecked-{c["complaint"]}"><code>{c["complaint"]}</code>: {c["missing"]}</li>' in page
    assert "6 traces matched no known span convention and gave no request row (root spans: llm.request (4), GET /health (2))" in page


def test_nothing_found_names_only_what_was_checked(quiet: WebServer) -> None:
    report = _get(quiet, "/api/diagnosis").json()["report"]
    assert report["findings"] == []
    checked = [c["complaint"] for c in report["coverage"]["complaints"] if c["checkable"]]
    assert "stutter" not in checked and "peak_hours" in checked  # no token times: no gaps
    page = _get(quiet, "/diagnosis").text
    assert f"tokentrace checked for each of these {len(checked)}:" in page
    listed = page.split('<ul class="checked">')[1].split("</ul>")[0]
    assert listed.count("<li>") == len(checked) and "<code>stutter</code>" not in listed
    assert f"The window's traces could not show the other {10 - len(checked)}" in page


@pytest.mark.slow
def test_traces_without_requests_are_not_passed_over_in_silence(only_custom_spans: WebServer) -> None:
    report = _get(only_custom_spans, "/api/diagnosis").json()["report"]
    assert report["requests"]["count"] == 0
    assert report["coverage"]["unmatched_traces"]["count"] == 4
    page = html.unescape(_get(only_custom_spans, "/diagnosis").text)
    assert "4 traces matched no known span convention and gave no request row (root spans: GET /health (2), llm.request (2))" in page
