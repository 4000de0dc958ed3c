"""The trace page's timeline over real vLLM under OpenLLMetry (tests/data/engines/stutter):
vLLM sends no token times, so the row's ITL and stalls are the client span's chunk events,
and the timeline draws those, with the row's stalls on them."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from tracegen import XSS_NAME

#: Pages on 127.0.0.1 need no CA bundle (a new client loads one: ~20 ms a request).
NO_TLS = {"verify": False, "timeout": 30}
RECORDED = Path(__file__).resolve().parents[1] / "data" / "engines"


def _rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = duckdb.connect(str(db), read_only=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _stalled(db: Path) -> tuple[str, int, float]:
    """Gives the trace id, stall count and largest gap of the stream with the most stalls."""
    [row] = _rows(
        db,
        "SELECT trace_id, stall_count, itl_max_ms FROM requests "
        "ORDER BY stall_count DESC NULLS LAST, trace_id LIMIT 1",
    )
    return str(row[0]), int(row[1]), float(row[2])


def test_the_json_twin_draws_the_client_chunks_the_row_was_read_from(
    engine_recordings: tuple[str, Path],
) -> None:
    url, db = engine_recordings
    trace_id, stalls, itl_max = _stalled(db)
    assert stalls > 0  # the recording froze streams: the test has something to find
    measured = json.loads((RECORDED / "stutter.client.json").read_text())["requests"]
    (mine,) = [m for m in measured if m["trace_id"] == trace_id]
    (request,) = httpx.get(f"{url}/api/trace/{trace_id}", **NO_TLS).json()["requests"]
    assert request["summary"]["token_times_source"] == "client"
    assert request["token_times"] == "client"
    assert request["client_span"]["name"] == XSS_NAME  # the sender's name, as sent
    tl = request["timeline"]
    # every chunk the client's own code saw, at its time on the client's clock
    assert tl["tokens"] == [] and tl["chunk_count"] == len(mine["chunk_ms"])
    offsets = [c["ms"] for c in tl["chunks"]]
    first = offsets[0] - mine["chunk_ms"][0]  # the span opens after the client's own clock
    # (the instrumentation stamps a chunk within the loop turn the client's code sees it in)
    assert offsets == pytest.approx([ms + first for ms in mine["chunk_ms"]], abs=0.5)
    # the row's stalls, on the chunks: the analyzer's count and largest gap
    assert tl["stalls_from"] == "client" and tl["stall_count"] == stalls
    assert max(g["gap_ms"] for g in tl["stalls"]) == pytest.approx(itl_max, abs=0.001)


def test_a_client_span_without_chunk_times_says_it_records_none(
    engine_recordings: tuple[str, Path],
) -> None:
    url, db = engine_recordings
    [(trace_id,)] = _rows(
        db, "SELECT trace_id FROM requests WHERE token_times_source = 'none' ORDER BY 1 LIMIT 1"
    )
    (request,) = httpx.get(f"{url}/api/trace/{trace_id}", **NO_TLS).json()["requests"]
    assert request["token_times"] == "not_recorded" and request["timeline"]["chunks"] == []
    assert request["client_span"]["name"] == "chat tiny-llama"  # openai-v2's: no chunk times
    page = httpx.get(f"{url}/trace/{trace_id}", **NO_TLS).text
    assert "its client span, <code" in page and "chat tiny-llama</code>, records none" in page


def test_the_page_escapes_the_client_span_name(engine_recordings: tuple[str, Path]) -> None:
    url, db = engine_recordings
    trace_id, _, _ = _stalled(db)
    page = httpx.get(f"{url}/trace/{trace_id}", **NO_TLS).text
    assert XSS_NAME not in page
    escaped = html.escape(XSS_NAME, quote=False)  # as Jinja writes text: &lt; &gt;
    assert '<code class="client-span">' + escaped.replace("'", "&#39;") + "</code>" in page
    assert "stall after chunk" in page and "no client chunks" not in page
