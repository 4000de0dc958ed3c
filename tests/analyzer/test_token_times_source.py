"""Token times from the best source there is (docs/buckets.md, "Token times"): the server's
own, else the client span's chunks, also beside a server convention that has none (vLLM's
`llm_request`); each row says which (`token_times_source`), and every export carries it.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pyarrow.parquet as pq
import pytest

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.export import write_requests
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.spans import KIND_CLIENT, KIND_SERVER, Span, SpanEvent
from tokentrace.analyzer.summary import RequestSummary

from . import spanfactory as f
from .spanfactory import MS, new_id, span
from .workloads import Workload

T0 = 1_700_000_000 * 10**9
CHUNK = "gen_ai.content.completion.chunk"
#: the client's chunk gaps: steady 10 ms, one 400 ms freeze (a long prefill beside it)
GAPS_MS = [10.0] * 8 + [400.0] + [10.0] * 10


def _vllm_under_openllmetry(
    gaps_ms: list[float] = GAPS_MS, *, client_clock_ms: float = 0.0, events: bool = True
) -> list[Span]:
    """vLLM's `llm_request` (no token times) under OpenLLMetry's client span, one chunk event
    a chunk; `client_clock_ms`: how far the client host's clock runs ahead of the server's."""
    tid = new_id(32)
    ttft, server_ms, wire = 60.0, 60.0 + sum(gaps_ms), 8.0
    client_t0 = T0 + round(client_clock_ms * MS)
    firsts = [ttft + wire / 2]
    for gap in gaps_ms:
        firsts.append(firsts[-1] + gap)
    client = span(
        tid, "openai.chat", 0, server_ms + wire, kind=KIND_CLIENT,
        attrs={"gen_ai.operation.name": "chat", "gen_ai.request.model": "tiny"},
        resource={"service.name": "app"}, t0_ns=client_t0,
        events=[SpanEvent(CHUNK, client_t0 + round(t * MS)) for t in firsts] if events else [],
    )  # fmt: skip
    attrs = {
        "gen_ai.latency.time_to_first_token": ttft / 1000,
        "gen_ai.latency.e2e": server_ms / 1000,
        "gen_ai.latency.time_in_queue": 0.001,
        "gen_ai.latency.time_in_model_prefill": (ttft - 1) / 1000,
        "gen_ai.latency.time_in_model_decode": sum(gaps_ms) / 1000,
        "gen_ai.usage.prompt_tokens": 20,
        "gen_ai.usage.completion_tokens": len(gaps_ms) + 1,
        "gen_ai.request.id": f"chatcmpl-{tid[:8]}",
    }
    server = span(tid, "llm_request", wire / 2, server_ms, parent=client, kind=KIND_SERVER,
                  attrs=attrs, resource=dict(f.VLLM_RESOURCE))  # fmt: skip
    return [client, server]


def _one(spans: list[Span]) -> RequestSummary:
    (row,) = summarize_trace(spans).requests
    return row


def test_vllm_rows_take_the_client_chunks_as_token_times() -> None:
    row = _one(_vllm_under_openllmetry())
    assert row.source == "vllm"
    assert row.token_times_source == s.TOKEN_TIMES_CLIENT
    assert s.FLAG_NO_TOKEN_TIMES not in row.flags
    assert row.itl_gaps_ms == pytest.approx(GAPS_MS)
    assert row.itl_max_ms == pytest.approx(400.0)
    assert row.itl_p50_ms == pytest.approx(10.0)
    assert row.stall_count == 1  # the freeze: over 4x the median gap and 50 ms
    # the buckets stay vLLM's own: the chunks give gaps, not phases
    assert row.decode_ms == pytest.approx(sum(GAPS_MS))


@pytest.mark.parametrize("client_clock_ms", [-3_000.0, 0.0, 2_500.0])
def test_a_clock_offset_between_hosts_changes_no_gap(client_clock_ms: float) -> None:
    row = _one(_vllm_under_openllmetry(client_clock_ms=client_clock_ms))
    assert row.itl_gaps_ms == pytest.approx(GAPS_MS)
    assert row.stall_count == 1 and row.ttft_client_ms == pytest.approx(64.0)


def test_without_chunks_a_vllm_row_has_no_token_times() -> None:
    row = _one(_vllm_under_openllmetry(events=False))
    assert row.token_times_source == s.TOKEN_TIMES_NONE
    assert s.FLAG_NO_TOKEN_TIMES in row.flags
    assert row.itl_max_ms is None and row.stall_count is None


def test_the_server_own_token_times_come_first() -> None:
    # the SDK's token offsets (every 7 ms) and its client span's chunk offsets (spread
    # differently by the wire) are both there: the server's are the request's
    spans, _ = f.sdk_trace(1.0, 2.0, 30.0, 7.0, 12, wire=10.0)
    row = _one(spans)
    assert row.token_times_source == s.TOKEN_TIMES_SERVER
    assert row.itl_gaps_ms == pytest.approx([7.0] * 11, abs=0.01)


@pytest.mark.parametrize(
    ("build", "source"),
    [
        (lambda: f.sdk_trace(1.0, 2.0, 30.0, 7.0, 12), s.TOKEN_TIMES_SERVER),
        (lambda: f.sdk_trace(1.0, 2.0, 30.0, 7.0, 12, offsets=False), s.TOKEN_TIMES_NONE),
        (lambda: f.tgi_trace(1.0, 2.0, 30.0, 7.0, 12), s.TOKEN_TIMES_SERVER),
        (lambda: f.vllm_trace(2.0, 30.0, 70.0, wire=6.0), s.TOKEN_TIMES_NONE),
        (lambda: f.genai_client_trace(80.0, 9.0, 12), s.TOKEN_TIMES_CLIENT),
        (lambda: f.genai_client_trace(80.0, 9.0, 12, style="openinference"), s.TOKEN_TIMES_NONE),
        (lambda: f.genai_client_trace(80.0, 9.0, 12, style="genai"), s.TOKEN_TIMES_NONE),
    ],
    ids=["sdk", "sdk_no_offsets", "tgi_infer_steps", "vllm_alone", "openllmetry_only",
         "openinference_only", "genai_ttfc_only"],
)  # fmt: skip
def test_every_row_says_its_source(build: Any, source: str) -> None:
    spans, _ = build()
    row = _one(spans)
    assert row.token_times_source == source
    # a source of token times is one that gave gaps; none gives none
    assert (row.itl_max_ms is not None) == (source != s.TOKEN_TIMES_NONE)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_the_requests_export_carries_the_source(write_workload: Any, fmt: str) -> None:
    later = T0 + 10**9
    rows = [_one(_vllm_under_openllmetry()),
            _one(f.sdk_trace(1.0, 2.0, 30.0, 7.0, 12, t0_ns=later)[0]),
            _one(f.vllm_trace(2.0, 30.0, 70.0, t0_ns=2 * later - T0)[0])]  # fmt: skip
    conn = write_workload(Workload(requests=rows))
    out = io.BytesIO()
    write_requests(conn, Filters(), fmt, out)
    data = out.getvalue()
    if fmt == "jsonl":
        got = [json.loads(line)["token_times_source"] for line in data.decode().splitlines()]
    elif fmt == "csv":
        got = [r["token_times_source"] for r in csv.DictReader(io.StringIO(data.decode()))]
    else:
        got = pq.read_table(io.BytesIO(data)).column("token_times_source").to_pylist()
    assert got == ["client", "server", "none"]  # oldest first, as the rows started
