"""Fixtures of the web tests: one generated database and a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hostile import generate_hostile
from tracegen import XSS_NAME, GeneratedRequest, generate, generate_emitters
from tt_testkit import explorer
from web_testkit import (
    CHROMIUM,
    CHROMIUM_ARGS,
    MANY_SPANS,
    ONE_SLICE_COUNT,
    ONE_SLICE_STEP_NS,
    HostileServer,
    WebServer,
    edited_copy,
)


@pytest.fixture(scope="session")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[GeneratedRequest]]:
    return generate(tmp_path_factory.mktemp("webdb"))


@pytest.fixture(scope="session")
def web(generated: tuple[Path, list[GeneratedRequest]]) -> Iterator[WebServer]:
    db, requests = generated
    with explorer(db) as url:
        yield WebServer(url, db, requests)


@pytest.fixture(scope="session")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileServer]:
    """A server over traces whose every string a sender controls is hostile (tests/hostile.py)."""
    db, traces = generate_hostile(tmp_path_factory.mktemp("webdb-hostile"))
    with explorer(db) as url:
        yield HostileServer(url, db, traces)


@pytest.fixture(scope="session")
def emitters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """Serves traces of another emitter (vLLM), kept whole but with no per-token times:
    gives the URL and their trace ids by name (tracegen.generate_emitters)."""
    db, ids = generate_emitters(tmp_path_factory.mktemp("webdb-emitters"))
    with explorer(db) as url:
        yield url, ids


@pytest.fixture(scope="session")
def engine_recordings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """Serves the real vLLM recordings under OpenLLMetry (stutter: chunk events, no server
    token times) and openai-v2 (no chunk times at all), imported as `tokentrace import` does;
    the client span of the stream with the most stalls is renamed to a script.  Gives the URL
    and the database."""
    from tokentrace.collector.settings import CollectorSettings
    from tokentrace.file_import import import_files

    db = tmp_path_factory.mktemp("webdb-engines") / "engines.duckdb"
    recorded = Path(__file__).resolve().parents[1] / "data" / "engines"
    import_files(CollectorSettings(db=db), [recorded / "stutter.jsonl", recorded / "chat_openai_v2.jsonl"])
    conn = duckdb.connect(str(db))
    try:
        conn.execute(
            "UPDATE spans SET name = ? WHERE name = 'openai.chat' AND trace_id = (SELECT trace_id "
            "FROM requests ORDER BY stall_count DESC NULLS LAST, trace_id LIMIT 1)",
            [XSS_NAME],
        )
    finally:
        conn.close()
    with explorer(db) as url:
        yield url, db


#: The second database's idle stretch between its two halves of requests.
IDLE_NS = 600 * 10**9


@pytest.fixture(scope="session")
def edited(generated: tuple[Path, list[GeneratedRequest]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    """A copy of the generated database with what real traffic has and the generator lacks:
    requests of 10 s and more, requests without a tenant, and ten idle minutes mid-way."""
    yield from edited_copy(
        generated,
        tmp_path_factory,
        "webdb-edited",
        ("UPDATE requests SET e2e_ms = e2e_ms * 20", []),
        ("UPDATE requests SET tenant = '' WHERE request_id IN ('req-0001', 'req-0002')", []),
        ("UPDATE requests SET start_ns = start_ns + ? WHERE request_id >= 'req-0060'", [IDLE_NS]),
    )


@pytest.fixture(scope="session")
def one_slice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    """A first try of the SDK: five requests within 0.4 s (one time bin) and no client
    spans, so network was not measured."""
    tmp = tmp_path_factory.mktemp("webdb-one-slice")
    db, requests = generate(tmp, count=ONE_SLICE_COUNT, evil=False)
    conn = duckdb.connect(str(db))
    try:
        first = conn.execute("SELECT min(start_ns) FROM requests").fetchone()[0]  # type: ignore[index]
        origin = first - first % 10**9 + 5430 * 10**9 + 100_000_000  # 01:30:30.1, well inside one second
        conn.execute(
            "UPDATE requests SET start_ns = ? + ? * (CAST(substr(request_id, 5) AS BIGINT)), "
            "e2e_ms = e2e_ms - coalesce(network_ms, 0), network_ms = NULL, ttft_client_ms = NULL",
            [origin, ONE_SLICE_STEP_NS],
        )
    finally:
        conn.close()
    with explorer(db) as url:
        yield WebServer(url, db, requests)


@pytest.fixture(scope="session")
def two_services(generated: tuple[Path, list[GeneratedRequest]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    """A copy of the generated database whose second half of requests comes from another service."""
    yield from edited_copy(
        generated,
        tmp_path_factory,
        "webdb-two-services",
        ("UPDATE requests SET service = 'llm-server-b' WHERE request_id >= 'req-0060'", []),
    )


@pytest.fixture(scope="session")
def many_spans(generated: tuple[Path, list[GeneratedRequest]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    """A copy of the generated database whose first kept trace (by trace id) has MANY_SPANS more
    spans under its request span, as an agent's tool calls: the first hundred its children, each
    of the rest a child of one of those."""
    yield from edited_copy(
        generated,
        tmp_path_factory,
        "webdb-many-spans",
        (
            "INSERT INTO spans SELECT s.trace_id, printf('%016x', 1000000 + i), "
            "CASE WHEN i < 100 THEN s.span_id ELSE printf('%016x', 1000000 + i % 100) END, "
            "'tool.call ' || i, 1, s.start_ns + i * 1000, s.start_ns + i * 1000 + 500000, 0, '', "
            "s.service_name, 'tools', json_object('k', i, 'db.statement', 'SELECT ' || i), '[]', '[]', s.resource, s.commit_seq "
            "FROM spans s, range(?) t(i) WHERE s.span_id = (SELECT span_id FROM spans WHERE name = ? "
            "ORDER BY trace_id LIMIT 1)",
            [MANY_SPANS, "tokentrace.request"],
        ),
    )


@pytest.fixture(scope="session")
def few_user_ttft(generated: tuple[Path, list[GeneratedRequest]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    """A copy of the generated database in which only the first request's client span measured
    the user's TTFT (the others came without one)."""
    yield from edited_copy(
        generated,
        tmp_path_factory,
        "webdb-few-user-ttft",
        ("UPDATE requests SET ttft_client_ms = NULL WHERE request_id <> 'req-0000'", []),
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Gives a headless Chromium (Debian's) driven by Playwright, one per test module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """Gives a fresh page that records alert dialogs (`page.dialogs`) and script errors (`page.js_errors`)."""
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
