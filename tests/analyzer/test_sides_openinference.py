"""OpenInference's LLM span is the user's side of a request although it is INTERNAL
(`analyzer/conventions/_sides.py`): the httpx `POST` CLIENT span under it ends when the
response headers arrive, at once for a stream, so taking it as the user's cut E2E short and
read the network as negative.  Its "First Token Stream Event" is TTFT (user).
"""

from __future__ import annotations

import dataclasses

import pytest

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, Span, SpanEvent
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.instrumentation import semconv as sc

from . import spanfactory as f
from .spanfactory import MS, new_id, span

T0 = 1_700_000_000 * 10**9
#: the call as the user lived it, and when the first token reached it (ms)
CALL_MS, FIRST_TOKEN_MS = 340.0, 112.0
#: the httpx span: opened 2 ms into the call, closed at the response headers
POST_START_MS, POST_MS = 2.0, 15.0


def _openinference_call(tid: str) -> tuple[Span, Span]:
    """OpenInference's `ChatCompletion` (INTERNAL) and the httpx `POST` under it."""
    call = span(tid, "ChatCompletion", 0, CALL_MS, kind=KIND_INTERNAL,
                attrs={"openinference.span.kind": "LLM", "llm.model_name": "tiny",
                       "llm.system": "openai"},
                resource={"service.name": "chat-app"}, t0_ns=T0,
                events=[SpanEvent("First Token Stream Event", T0 + FIRST_TOKEN_MS * MS)])  # fmt: skip
    post = span(tid, "POST", POST_START_MS, POST_MS, parent=call, kind=KIND_CLIENT,
                attrs={"http.method": "POST", "http.status_code": 200}, t0_ns=T0)  # fmt: skip
    return call, post


def _under_vllm() -> tuple[RequestSummary, float]:
    tid = new_id(32)
    call, post = _openinference_call(tid)
    server_ms = 77.0
    attrs = {
        "gen_ai.latency.time_to_first_token": 0.0115,
        "gen_ai.latency.e2e": server_ms / 1000,
        "gen_ai.latency.time_in_queue": 0.00002,
        "gen_ai.latency.time_in_model_prefill": 0.0075,
        "gen_ai.latency.time_in_model_decode": 0.066,
        "gen_ai.usage.completion_tokens": 24,
        "gen_ai.request.id": "chatcmpl-chat-001",
    }
    server = span(tid, "llm_request", 40.0, server_ms, parent=post, kind=KIND_SERVER,
                  attrs=attrs, resource=dict(f.VLLM_RESOURCE), t0_ns=T0)  # fmt: skip
    (row,) = summarize_trace([post, server, call]).requests
    return row, server_ms


def test_vllm_request_under_openinference() -> None:
    row, server_ms = _under_vllm()
    assert row.source == "vllm"
    assert s.FLAG_NEGATIVE_NETWORK not in row.flags
    assert row.e2e_ms == pytest.approx(CALL_MS)
    assert row.network_ms == pytest.approx(CALL_MS - server_ms)
    assert row.start_ns == T0  # the user's call starts the request, not the httpx span
    assert row.ttft_client_ms == pytest.approx(FIRST_TOKEN_MS)
    # one first-token mark is no token times
    assert row.token_times_source == s.TOKEN_TIMES_NONE


def test_sdk_request_under_openinference() -> None:
    tid = new_id(32)
    call, post = _openinference_call(tid)
    spans, _ = f.sdk_trace(1.0, 2.0, 30.0, 7.0, 12, t0_ns=T0 + round(30 * MS))
    server = [dataclasses.replace(x, trace_id=tid) for x in spans]
    next(x for x in server if x.name == sc.SPAN_REQUEST).parent_span_id = post.span_id
    (row,) = summarize_trace([call, post, *server]).requests
    assert row.source == "tokentrace"
    assert s.FLAG_NEGATIVE_NETWORK not in row.flags
    assert row.e2e_ms == pytest.approx(CALL_MS)
    assert row.ttft_client_ms == pytest.approx(FIRST_TOKEN_MS)
    assert row.token_times_source == s.TOKEN_TIMES_SERVER


def test_an_outer_client_span_is_still_the_user() -> None:
    # OpenLLMetry's span is CLIENT: above the httpx one, the outermost is the user's, as before
    tid = new_id(32)
    call, post = _openinference_call(tid)
    call.kind, call.attributes = KIND_CLIENT, {"gen_ai.operation.name": "chat"}
    server = span(tid, "llm_request", 40.0, 77.0, parent=post, kind=KIND_SERVER,
                  attrs={"gen_ai.latency.e2e": 0.077}, resource=dict(f.VLLM_RESOURCE),
                  t0_ns=T0)  # fmt: skip
    (row,) = summarize_trace([call, post, server]).requests
    assert row.e2e_ms == pytest.approx(CALL_MS) and row.network_ms == pytest.approx(CALL_MS - 77)
