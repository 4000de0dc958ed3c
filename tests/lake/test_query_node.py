"""`tokentrace serve --lake URI --no-receivers`: a query node answers what the file's explorer
answers, sees what the shards move in after it started, and says when the catalog is gone."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from query_kit import FilledLake, QueryNode, copy_into_lake, fill_lake, start_query_node, tokentrace
from tracegen import generate
from tt_testkit import explorer
from web_testkit import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.slow

#: What differs between two explorers by when and how fast each computed its report.
VOLATILE = {"report_compute_s", "report_age_s", "report_refreshing", "report_pending"}


@pytest.fixture(scope="module")
def filled(postgres: Any, tmp_path_factory: pytest.TempPathFactory) -> FilledLake:
    tmp = tmp_path_factory.mktemp("query-node")
    uri, data = postgres.new_lake(tmp / "lake-data")
    return fill_lake(tmp, uri, data)


@pytest.fixture(scope="module")
def node(
    filled: FilledLake, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[QueryNode, Path]]:
    cwd = tmp_path_factory.mktemp("node-cwd")  # where a local tokentrace.duckdb would appear
    node = start_query_node(filled.uri, None, cwd)
    try:
        yield node, cwd
    finally:
        node.stop()


@pytest.fixture(scope="module")
def file_explorer(filled: FilledLake) -> Iterator[str]:
    with explorer(filled.db) as url:
        yield url


def _json(url: str) -> Any:
    response = httpx.get(url, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def _steady(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in VOLATILE}


def test_a_query_node_answers_what_the_files_explorer_answers(
    node: tuple[QueryNode, Path], file_explorer: str, filled: FilledLake
) -> None:
    lake_url = node[0].url
    for path in ("/api/diagnosis?window=all", "/api/overview?window=all"):
        over_lake, over_file = _json(lake_url + path), _json(file_explorer + path)
        assert over_lake["report"]["requests"]["count"] == len(filled.requests)
        assert _steady(over_lake) == _steady(over_file), path
    kept = next(
        r.trace_id
        for r in filled.requests
        if _json(f"{file_explorer}/api/trace/{r.trace_id}")["span_count"]
    )
    for path in (
        f"/api/trace/{kept}",
        f"/api/trace/{filled.requests[1].trace_id}",
        f"/api/trace/{kept}/chrome.json",
        "/api/search?window=all&limit=20&model=llama-8b&sort=e2e_ms",
        "/api/search?window=all&limit=5&tenant=acme&min_e2e=500",
    ):
        assert _json(lake_url + path) == _json(file_explorer + path), path
    trace = _json(f"{lake_url}/api/trace/{kept}")
    assert trace["span_count"] > 0 and trace["requests"]
    page = httpx.get(f"{lake_url}/trace/{kept}", timeout=60)
    assert page.status_code == 200 and kept in page.text
    overview = httpx.get(f"{lake_url}/?window=all", timeout=60)
    assert overview.status_code == 200 and "No requests" not in overview.text


def test_a_query_node_opens_no_file_and_runs_no_receivers(node: tuple[QueryNode, Path]) -> None:
    query_node, cwd = node
    assert list(cwd.iterdir()) == []
    assert httpx.get(query_node.url + "/readyz", timeout=30).json() == {"status": "ready"}
    for port in (4317, 4318):  # serve's default OTLP ports: a query node binds neither
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                pytest.skip(f"another program listens on {port} here")


def test_rows_moved_in_after_start_show_up(
    node: tuple[QueryNode, Path], filled: FilledLake, tmp_path: Path
) -> None:
    lake_url = node[0].url
    # another trace, moved in as a shard's mover would, while the node runs
    later, requests = generate(tmp_path, count=6, seed=11, evil=False)
    new_id = requests[0].trace_id
    assert httpx.get(f"{lake_url}/api/trace/{new_id}", timeout=30).status_code == 404
    copy_into_lake(later, filled.uri, filled.data, where=f"trace_id IN ('{new_id}')")
    trace = _json(f"{lake_url}/api/trace/{new_id}")
    assert trace["requests"][0]["summary"]["request_id"] == requests[0].request_id
    rows = httpx.get(f"{lake_url}/api/requests.jsonl?window=all", timeout=60).text.splitlines()
    assert len(rows) == len(filled.requests) + 1


def test_readyz_says_when_the_catalog_does_not_answer(postgres: Any, tmp_path: Path) -> None:
    uri, data = postgres.new_lake(tmp_path / "data")
    copy_into_lake(generate(tmp_path, count=4, evil=False)[0], uri, data)
    node = start_query_node(uri, data, tmp_path)
    name = uri.split("dbname=")[1].split()[0]
    try:
        assert httpx.get(node.url + "/readyz", timeout=30).status_code == 200
        postgres.sql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        postgres.sql(
            f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"  # noqa: S608 - the test's own lake name
        )
        down = httpx.get(node.url + "/readyz", timeout=30)
        assert down.status_code == 503
        assert down.json()["status"] == "unavailable"
        assert down.json()["reason"].startswith(f"cannot read the lake {uri}: ")
        page = httpx.get(node.url + "/api/overview?window=all", timeout=30)
        assert page.status_code == 503 and page.json()["error"].startswith("cannot read the lake")
        postgres.sql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        assert httpx.get(node.url + "/readyz", timeout=30).json() == {"status": "ready"}
        assert _json(node.url + "/api/overview?window=all")["report"]["requests"]["count"] == 4
    finally:
        postgres.sql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        node.stop()


def test_a_query_node_started_before_any_shard_is_ready_once_one_makes_the_lake(
    postgres: Any, tmp_path: Path
) -> None:
    """Shards and query nodes start in any order: a catalog no shard has made a lake in yet
    is waited for (not ready, pages 503 with the reason), not a failed start."""
    uri, data = postgres.new_lake(tmp_path / "data")
    node = start_query_node(uri, None, tmp_path)
    try:
        waiting = httpx.get(node.url + "/readyz", timeout=30)
        assert waiting.status_code == 503
        assert "holds no lake yet: the first `tokentrace serve --lake …`" in waiting.json()["reason"]
        copy_into_lake(generate(tmp_path, count=3, evil=False)[0], uri, data)  # as a shard would
        assert httpx.get(node.url + "/readyz", timeout=30).json() == {"status": "ready"}
        assert _json(node.url + "/api/overview?window=all")["report"]["requests"]["count"] == 3
    finally:
        node.stop()


def test_an_empty_lake_page_names_the_shards_not_an_otlp_port(
    postgres: Any, tmp_path: Path
) -> None:
    uri, data = postgres.new_lake(tmp_path / "data")
    copy_into_lake(generate(tmp_path, count=2, evil=False)[0], uri, data, where="false")
    node = start_query_node(uri, None, tmp_path)
    try:
        page = httpx.get(node.url + "/", timeout=60)
        assert page.status_code == 200
        assert "No requests in the lake yet" in page.text
        assert "4318" not in page.text and "/v1/traces" not in page.text
    finally:
        node.stop()


def test_query_node_settings_that_contradict_are_one_line(
    filled: FilledLake, tmp_path: Path
) -> None:
    done = tokentrace("serve", "--no-receivers", cwd=tmp_path)
    assert done.returncode != 0
    assert "--no-receivers makes a query node over the lake: give --lake too" in done.stderr
    done = tokentrace(
        "serve", "--lake", filled.uri, "--no-receivers", "--db", "x.duckdb", cwd=tmp_path
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "tokentrace serve: --db names a local file, which a query node (--no-receivers) never opens: drop one"
    )
    done = tokentrace(
        "serve",
        "--lake",
        "postgres:dbname=nowhere host=127.0.0.1 port=1 password=pw",
        "--no-receivers",
        cwd=tmp_path,
    )
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("tokentrace serve: cannot attach the lake postgres:dbname=nowhere")
    assert "pw" not in line.replace("password=***", "")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.browser
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's /usr/bin/chromium")
def test_a_browser_reads_the_query_nodes_overview_and_trace_page(
    node: tuple[QueryNode, Path], filled: FilledLake, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    url = node[0].url
    stalled = next(r for r in filled.requests if r.stalled)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{url}/?window=all")
            page.wait_for_selector(".cards")
            assert "No requests" not in page.locator("main").inner_text()
            assert page.locator(".charts").count() == 1
            page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)
            page.goto(f"{url}/trace/{stalled.trace_id}")
            section = page.locator("section.request").first
            assert section.locator("svg.timeline").count() == 1
            assert section.locator("polyline.gpu").count() == 1  # GPU samples, read from the lake
            assert stalled.trace_id in page.locator("main").inner_text()
            page.screenshot(path=str(tmp_path / "trace.png"), full_page=True)
            assert errors == []
        finally:
            browser.close()
