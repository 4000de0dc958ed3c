"""Adapter for vLLM's `llm_request` span (V1 engine, 0.11+; V0 engine; DESIGN.md §3).

vLLM gives float-second attributes measured on the engine's clock:
prefill = time_in_model_prefill, decode = time_in_model_decode, queue_wait =
time_in_queue, and e2e.  The queue bucket is e2e − prefill − decode.  The span
itself starts at the engine's arrival time, so its duration and the e2e
attribute measure the same thing; when they disagree the request is flagged.

The V0 engine (vllm/engine/llm_engine.py `create_trace_span`, before the V1
engine replaced it) names the span the same but sets no
prefill/decode attributes: only time_in_queue, time_to_first_token, e2e (and
time_in_scheduler / time_in_model_forward / time_in_model_execute).  There
prefill = TTFT − time_in_queue and decode = e2e − TTFT, all measured from the
same arrival time.

No V1 span names the model: `do_tracing` (vllm/v1/engine/output_processor.py) sets no
`gen_ai.response.model` nor `gen_ai.request.model` (V0's `create_trace_span` set the
first), and the resource (vllm/tracing/otel.py `init_tracer`) holds only
`service.name` = `vllm.llm_engine` (newest releases; `unknown_service` before),
`vllm.instrumenting_module_name` and `vllm.process_id`.  The model then reads as the
service name, flagged `model_unnamed`; `OTEL_RESOURCE_ATTRIBUTES=gen_ai.request.model=…`
on the server names it.
"""

from __future__ import annotations

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.buckets import NS_PER_MS, partition
from tokentrace.analyzer.conventions._common import agree, build_summary
from tokentrace.analyzer.conventions._sides import RequestSides, Sides
from tokentrace.analyzer.conventions._values import ValueReader
from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.trace_view import TraceView

NAME = "vllm"
#: queue parts vLLM does not report (their columns read 0): pages show them as not measured
UNMEASURED_PARTS = frozenset({"tokenize"})
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
    requests = [x for x in trace.spans if x.name == SPAN_NAME and _is_vllm(x)]
    sides = RequestSides(trace, [[x] for x in requests])
    return [_summarize(trace, x, sides.of(x)) for x in requests]


def _is_vllm(span: Span) -> bool:
    # any of its gen_ai attributes: one missing (e2e, say) must not lose the request
    return E2E in span.attributes or any(k.startswith("gen_ai.") for k in span.attributes)


def _summarize(trace: TraceView, span: Span, sides: Sides) -> s.RequestSummary:
    a = span.attributes
    rd = ValueReader()
    flags: list[str] = []
    e2e_ns = rd.seconds_ns(a.get(E2E))
    if e2e_ns is not None and span.duration_ns and not agree(e2e_ns, span.duration_ns):
        flags.append(s.FLAG_SOURCES_DISAGREE)
    server_ns = e2e_ns or span.duration_ns
    queue_wait_ns = rd.seconds_ns(a.get(QUEUE)) or 0
    ttft_ns = rd.seconds_ns(a.get(TTFT))
    prefill_attr, decode_attr = rd.seconds_ns(a.get(PREFILL)), rd.seconds_ns(a.get(DECODE))
    decode_ns: int | None
    if prefill_attr is None and decode_attr is None and ttft_ns is not None:
        prefill_ns, decode_ns = _v0_phases(ttft_ns, queue_wait_ns, server_ns)
    else:
        prefill_ns, decode_ns = prefill_attr or 0, decode_attr
    inference_ns = rd.seconds_ns(a.get(INFERENCE))
    if inference_ns is not None and not agree(inference_ns, prefill_ns + (decode_ns or 0)):
        flags.append(s.FLAG_SOURCES_DISAGREE)
    client = sides.client
    part = partition(
        # the attributes share one clock; the e2e attribute is their whole, unless an
        # outer server span (the API server's HTTP span, a gateway's) holds more
        server_ns=sides.server_ns(server_ns),
        client_ns=client.duration_ns if client is not None else None,
        prefill_ns=prefill_ns,
        decode_ns=decode_ns or 0,
        queue_wait_ns=queue_wait_ns,
    )
    return build_summary(
        trace,
        span,
        part,
        source=NAME,
        request_id=str(a.get(REQUEST_ID) or ""),
        client=client,
        server=sides.server,
        ttft_ms=None if ttft_ns is None else ttft_ns / NS_PER_MS,
        prompt_tokens=rd.count(a.get(PROMPT_TOKENS)),
        output_tokens=rd.count(a.get(COMPLETION_TOKENS)),
        flags=[*flags, s.FLAG_NO_TOKEN_TIMES],
        reader=rd,
        decode_measured=decode_ns is not None,
    )


def _v0_phases(ttft_ns: int, queue_wait_ns: int, server_ns: int) -> tuple[int, int]:
    """Gives (prefill, decode) of a V0-engine span, which has no prefill/decode attributes.

    V0's time_in_queue is first_scheduled − arrival and its TTFT first_token −
    arrival (vllm/engine/llm_engine.py `create_trace_span`; V0 engine): what
    lies between is the prefill; what follows the first token is the decode.
    """
    return max(0, ttft_ns - queue_wait_ns), max(0, server_ns - ttft_ns)
