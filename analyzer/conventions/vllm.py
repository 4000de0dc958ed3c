"""Adapter for vLLM's `llm_request` span (V1 engine, 0.11+; DESIGN.md §3).

vLLM gives float-second attributes measured on the engine's clock:
prefill = time_in_model_prefill, decode = time_in_model_decode, queue_wait =
time_in_queue, and e2e.  The queue bucket is e2e − prefill − decode.  The span
itself starts at the engine's arrival time, so its duration and the e2e
attribute measure the same thing; when they disagree the request is flagged.
"""

from __future__ import annotations

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.buckets import NS_PER_MS, partition
from tokentrace.analyzer.conventions._common import agree, build_summary
from tokentrace.analyzer.conventions._values import ValueReader
from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.trace_view import TraceView

NAME = "vllm"
SPAN_NAME = "llm_request"
TTFT = "gen_ai.latency.time_to_first_token"
E2E = "gen_ai.latency.e2e"
QUEUE = "gen_ai.latency.time_in_queue"
PREFILL = "gen_ai.latency.time_in_model_prefill"
DECODE = "gen_ai.latency.time_in_model_decode"
INFERENCE = "gen_ai.latency.time_in_model_inference"
PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
REQUEST_ID = "gen_ai.request.id"


def summarize(trace: TraceView) -> list[s.RequestSummary]:
    return [_summarize(trace, x) for x in trace.spans if x.name == SPAN_NAME and _is_vllm(x)]


def _is_vllm(span: Span) -> bool:
    # any of its gen_ai attributes: one missing (e2e, say) must not lose the request
    return E2E in span.attributes or any(k.startswith("gen_ai.") for k in span.attributes)


def _summarize(trace: TraceView, span: Span) -> s.RequestSummary:
    a = span.attributes
    rd = ValueReader()
    flags: list[str] = []
    e2e_ns = rd.seconds_ns(a.get(E2E))
    if e2e_ns is not None and span.duration_ns and not agree(e2e_ns, span.duration_ns):
        flags.append(s.FLAG_SOURCES_DISAGREE)
    prefill_ns = rd.seconds_ns(a.get(PREFILL)) or 0
    decode_ns = rd.seconds_ns(a.get(DECODE)) or 0
    inference_ns = rd.seconds_ns(a.get(INFERENCE))
    if inference_ns is not None and not agree(inference_ns, prefill_ns + decode_ns):
        flags.append(s.FLAG_SOURCES_DISAGREE)
    client = trace.client_span_of(span)
    part = partition(
        # the attributes share one clock; the e2e attribute is their whole
        server_ns=e2e_ns or span.duration_ns,
        client_ns=client.duration_ns if client is not None else None,
        prefill_ns=prefill_ns,
        decode_ns=decode_ns,
        queue_wait_ns=rd.seconds_ns(a.get(QUEUE)) or 0,
    )
    ttft_ns = rd.seconds_ns(a.get(TTFT))
    return build_summary(
        trace,
        span,
        part,
        source=NAME,
        request_id=str(a.get(REQUEST_ID) or ""),
        client=client,
        ttft_ms=None if ttft_ns is None else ttft_ns / NS_PER_MS,
        prompt_tokens=rd.count(a.get(PROMPT_TOKENS)),
        output_tokens=rd.count(a.get(COMPLETION_TOKENS)),
        flags=[*flags, s.FLAG_NO_TOKEN_TIMES],
        reader=rd,
    )
