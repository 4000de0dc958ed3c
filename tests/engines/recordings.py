"""The engine recordings (tests/data/engines/) as tests read them: the spans tokentrace's
file reader gives, what the client measured itself, and a real DuckDB file they were
imported into.  See tests/data/engines/PROVENANCE.md for what made them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tokentrace.analyzer.spans import Span
from tokentrace.collector.otlp_file import read_otlp_file
from tokentrace.collector.settings import CollectorSettings
from tokentrace.file_import import import_files
from tokentrace.store.connection import open_read_only

RECORDINGS = Path(__file__).resolve().parents[1] / "data" / "engines"
#: the recordings of real vLLM serving real instrumented clients
VLLM_CLIENT_RUNS = (
    "chat_openllmetry", "chat_openinference", "chat_openai_v2", "stutter", "tenants",
    "batch_events", "client_errors", "fanout",
)  # fmt: skip
#: the OpenLLMetry runs against vLLM: a chunk event per streamed chunk on the client span
OPENLLMETRY_RUNS = ("chat_openllmetry", "stutter", "tenants", "batch_events")
#: vLLM's V1 engine span
LLM_REQUEST = "llm_request"
#: "within a few ms": the client's own clock starts before the instrumentation's span does
CLIENT_AGREE_MS = 5.0
#: vLLM's attributes are float seconds; tokentrace's columns ms
VLLM_AGREE_MS = 0.01


@dataclass(frozen=True)
class Recording:
    name: str
    spans: list[Span]
    #: one dict per request the client sent (client_driver.Measured), [] for vllm_startup
    client: list[dict[str, Any]]
    #: span id -> the events the sender's SDK dropped (its limit: 128 a span); tokentrace's
    #: reader does not keep the count
    dropped_events: dict[str, int]

    def llm_requests(self) -> list[Span]:
        """Gives vLLM's request spans."""
        return [s for s in self.spans if s.name == LLM_REQUEST]

    def trace(self, trace_id: str) -> list[Span]:
        return [s for s in self.spans if s.trace_id == trace_id]

    def client_span(self, trace_id: str) -> Span:
        """Gives the instrumentation's span of the OpenAI call in `trace_id` (the httpx
        span's parent)."""
        spans = {s.span_id: s for s in self.trace(trace_id)}
        (post,) = [s for s in spans.values() if s.name == "POST"]
        return spans[post.parent_span_id]


@cache
def load(name: str) -> Recording:
    """Gives one recording, read as `tokentrace import` reads it."""
    path = RECORDINGS / f"{name}.jsonl"
    measured = RECORDINGS / f"{name}.client.json"
    client = json.loads(measured.read_text())["requests"] if measured.exists() else []
    dropped = {
        span["spanId"]: int(span["droppedEventsCount"])
        for line in path.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
        if span.get("droppedEventsCount")
    }
    return Recording(name, read_otlp_file(path), client, dropped)


def import_into(db: Path, *names: str) -> dict[str, int]:
    """Imports the recordings `names` into the database `db`; gives import's counts."""
    return import_files(CollectorSettings(db=db), [RECORDINGS / f"{n}.jsonl" for n in names])


def request_rows(db: Path) -> list[dict[str, Any]]:
    """Gives every row of the `requests` table, oldest first."""
    conn = open_read_only(db)
    try:
        cursor = conn.execute("SELECT * FROM requests ORDER BY start_ns, request_id")
        cols = [d[0] for d in cursor.description]
        return [dict(zip(cols, row, strict=True)) for row in cursor.fetchall()]
    finally:
        conn.close()


def report(db: Path) -> dict[str, Any]:
    """Gives the report over the whole database."""
    from tokentrace.analyzer.report import build_report

    conn = open_read_only(db)
    try:
        return build_report(conn)
    finally:
        conn.close()


def seconds_ms(span: Span, key: str) -> float:
    """Gives a vLLM float-seconds attribute in ms."""
    return float(span.attributes[key]) * 1000.0
