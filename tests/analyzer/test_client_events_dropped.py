"""A client span whose SDK dropped events (`dropped_events_count`): the OpenTelemetry SDK
keeps 128 events a span by default and drops the oldest, so a long stream's first chunk
events are gone.  Its first kept chunk is never the first token: TTFT (user) comes from
`gen_ai.response.time_to_first_chunk` where sent, else stays null, and the row is flagged
`client_events_dropped`; the kept chunks' gaps are still gaps (docs/buckets.md).
"""

from __future__ import annotations

import pytest

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import KIND_CLIENT, KIND_SERVER, Span, SpanEvent
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.instrumentation import semconv as sc

from . import spanfactory as f
from .spanfactory import MS, new_id, span

T0 = 1_700_000_000 * 10**9
CHUNK = "gen_ai.content.completion.chunk"
#: the SDK's default OTEL_SPAN_EVENT_COUNT_LIMIT
LIMIT = 128
CHUNKS = 161
TTFT_MS = 900.0
ITL_MS = 5.0


def _client(
    tid: str, *, dropped: bool, ttfc: bool = False, usage: bool = True, duration_ms: float
) -> Span:
    """OpenLLMetry's span of a 161-chunk stream; `dropped`: as the SDK exports it past its
    limit, the oldest 33 chunk events gone and counted."""
    firsts = [TTFT_MS + i * ITL_MS for i in range(CHUNKS)]
    kept = firsts[-LIMIT:] if dropped else firsts
    attrs: dict[str, object] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "tiny"}
    if usage:
        attrs["gen_ai.usage.output_tokens"] = CHUNKS
    if ttfc:
        attrs[sc.CLIENT_TTFC_S] = TTFT_MS / 1000
    c = span(tid, "openai.chat", 0, duration_ms, kind=KIND_CLIENT, attrs=attrs,
             resource={"service.name": "app"}, t0_ns=T0,
             events=[SpanEvent(CHUNK, T0 + round(t * MS)) for t in kept])  # fmt: skip
    c.dropped_events_count = CHUNKS - LIMIT if dropped else 0
    return c


def _beside_vllm(*, dropped: bool, ttfc: bool = False) -> RequestSummary:
    tid = new_id(32)
    server_ms = TTFT_MS - 4 + (CHUNKS - 1) * ITL_MS
    client = _client(tid, dropped=dropped, ttfc=ttfc, duration_ms=server_ms + 8)
    attrs = {
        "gen_ai.latency.time_to_first_token": (TTFT_MS - 8) / 1000,
        "gen_ai.latency.e2e": server_ms / 1000,
        "gen_ai.latency.time_in_queue": 0.5,
        "gen_ai.latency.time_in_model_prefill": 0.2,
        "gen_ai.latency.time_in_model_decode": (CHUNKS - 1) * ITL_MS / 1000,
        "gen_ai.usage.completion_tokens": CHUNKS,
        "gen_ai.request.id": "chatcmpl-batch",
    }
    server = span(tid, "llm_request", 4, server_ms, parent=client, kind=KIND_SERVER, attrs=attrs,
                  resource=dict(f.VLLM_RESOURCE), t0_ns=T0)  # fmt: skip
    (row,) = summarize_trace([client, server]).requests
    return row


def _client_only(*, dropped: bool, ttfc: bool = False, usage: bool = True) -> RequestSummary:
    duration_ms = TTFT_MS + (CHUNKS - 1) * ITL_MS + 1
    client = _client(new_id(32), dropped=dropped, ttfc=ttfc, usage=usage, duration_ms=duration_ms)
    (row,) = summarize_trace([client]).requests
    return row


def test_whole_list_first_chunk_is_the_first_token() -> None:
    row = _beside_vllm(dropped=False)
    assert row.ttft_client_ms == pytest.approx(TTFT_MS)
    assert s.FLAG_CLIENT_EVENTS_DROPPED not in row.flags
    assert len(row.itl_gaps_ms) == CHUNKS - 1


def test_truncated_list_gives_no_late_first_token() -> None:
    row = _beside_vllm(dropped=True)
    # the first kept chunk came 33 chunks (165 ms) after the first token: not read as it
    assert row.ttft_client_ms is None
    assert s.FLAG_CLIENT_EVENTS_DROPPED in row.flags
    # the kept chunks' gaps are still the stream's gaps (its last ones), from the client
    assert row.token_times_source == s.TOKEN_TIMES_CLIENT
    assert row.itl_gaps_ms == pytest.approx([ITL_MS] * (LIMIT - 1))
    assert s.FLAG_NO_TOKEN_TIMES not in row.flags


def test_truncated_list_takes_time_to_first_chunk() -> None:
    row = _beside_vllm(dropped=True, ttfc=True)
    assert row.ttft_client_ms == pytest.approx(TTFT_MS)
    assert s.FLAG_CLIENT_EVENTS_DROPPED in row.flags


@pytest.mark.parametrize("ttfc", [False, True])
def test_client_only_truncated_list(ttfc: bool) -> None:
    whole, cut = _client_only(dropped=False, ttfc=ttfc), _client_only(dropped=True, ttfc=ttfc)
    assert whole.ttft_client_ms == pytest.approx(TTFT_MS)
    assert cut.ttft_client_ms == (pytest.approx(TTFT_MS) if ttfc else None)
    assert cut.flags == [s.FLAG_SERVER_UNSEEN, s.FLAG_CLIENT_EVENTS_DROPPED]
    assert cut.output_tokens == whole.output_tokens == CHUNKS  # the usage attribute
    assert cut.itl_gaps_ms == pytest.approx([ITL_MS] * (LIMIT - 1))
    if ttfc:  # the first chunk's time known: decode runs to the span's end, with the stream
        assert cut.decode_ms == pytest.approx(whole.decode_ms + 1)
        assert cut.prefill_ms == pytest.approx(whole.prefill_ms)
    else:  # neither the first token nor the decode is known from the kept chunks
        assert cut.decode_ms == 0.0 and cut.prefill_ms == 0.0 and cut.tpot_ms is None


def test_kept_chunks_are_no_token_count() -> None:
    # without a usage attribute the chunks stand for the tokens, only when none was dropped
    assert _client_only(dropped=False, usage=False).output_tokens == CHUNKS
    assert _client_only(dropped=True, usage=False).output_tokens is None
