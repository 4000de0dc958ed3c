"""Adapter for Hugging Face TGI's router spans (DESIGN.md §3).

The handler span (`generate`, `generate_stream`, `chat_completions`,
`completions`; kind INTERNAL) carries Rust `Duration` Debug strings:
`total_time`, `validation_time`, `queue_time`, `inference_time`,
`time_per_token`.  Under it, `queued` is the queue wait and there is one
`infer` span per forward step, the first being the prefill.  TGI records no
TTFT; it is the end of the first `infer` step.  Batches are separate traces
linked from `infer` (see `analyzer/engine_steps.py`).
"""

from __future__ import annotations

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.buckets import NS_PER_MS, partition
from tokentrace.analyzer.conventions._common import agree, build_summary, inside_any
from tokentrace.analyzer.conventions._sides import RequestSides, Sides
from tokentrace.analyzer.conventions._values import ValueReader
from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.trace_view import TraceView

NAME = "tgi"
HANDLERS = frozenset({"generate", "generate_stream", "chat_completions", "completions"})
SPAN_QUEUED = "queued"
SPAN_INFER = "infer"
TOTAL = "total_time"
VALIDATION = "validation_time"
QUEUE = "queue_time"
INFERENCE = "inference_time"
PER_TOKEN = "time_per_token"
TIMING_KEYS = (TOTAL, QUEUE, INFERENCE)


def summarize(trace: TraceView) -> list[s.RequestSummary]:
    # chat_completions calls generate_stream inside: summarize the outermost only
    nested = inside_any(trace, _is_handler)
    handlers = [
        x for x in trace.spans if x.name in HANDLERS and _is_tgi(trace, x) and not nested(x)
    ]
    sides = RequestSides(trace, [[x] for x in handlers])
    return [_summarize(trace, x, sides.of(x)) for x in handlers]


def _is_handler(span: Span) -> bool:
    return span.name in HANDLERS


def _is_tgi(trace: TraceView, handler: Span) -> bool:
    # the timing fields, or (when a sender lost them) TGI's own child spans
    return any(k in handler.attributes for k in TIMING_KEYS) or any(
        c.name == SPAN_INFER or c.name == SPAN_QUEUED for c in trace.children.get(handler.span_id, ())
    )


def _summarize(trace: TraceView, handler: Span, sides: Sides) -> s.RequestSummary:
    a: dict[str, object] = {}
    below = list(trace.descendants(handler))
    # the timing fields may sit on a nested handler (chat_completions → generate_stream)
    for span in [*(x for x in below if x.name in HANDLERS), handler]:
        a.update({k: v for k, v in span.attributes.items() if k in (TOTAL, VALIDATION, QUEUE, INFERENCE, PER_TOKEN)})
    rd = ValueReader()
    flags: list[str] = []
    total_ns = rd.rust_duration_ns(a.get(TOTAL))
    server_ns = handler.duration_ns
    if total_ns is not None and not agree(total_ns, server_ns):
        flags.append(s.FLAG_SOURCES_DISAGREE)
    infers = sorted((x for x in below if x.name == SPAN_INFER), key=lambda x: x.start_ns)
    queued = [x for x in below if x.name == SPAN_QUEUED]
    inference_ns = rd.rust_duration_ns(a.get(INFERENCE))
    per_token_ns = rd.rust_duration_ns(a.get(PER_TOKEN))
    ttft_ns: int | None = None
    decode_ns: int | None
    offsets_ms: list[float] = []
    if infers:
        # each infer step ends with one token: server-side token times
        ends = sorted(x.end_ns for x in infers)
        prefill_ns = infers[0].duration_ns
        decode_ns = ends[-1] - ends[0]
        ttft_ns = ends[0] - handler.start_ns
        offsets_ms = [(e - handler.start_ns) / NS_PER_MS for e in ends]
        # one infer span per forward step; with speculative decoding (--speculate)
        # a step yields several tokens, so the timing fields count them when present
        output_tokens: int | None = _generated_tokens(inference_ns, per_token_ns) or len(infers)
    else:
        flags.append(s.FLAG_NO_TOKEN_TIMES)
        output_tokens = _generated_tokens(inference_ns, per_token_ns)
        prefill_ns = per_token_ns or 0
        decode_ns = None if inference_ns is None else max(0, inference_ns - prefill_ns)
    queue_attr_ns = rd.rust_duration_ns(a.get(QUEUE))
    queue_ns = sum(x.duration_ns for x in queued) if queued else queue_attr_ns or 0
    if queued and queue_attr_ns is not None and not agree(queue_ns, queue_attr_ns):
        flags.append(s.FLAG_SOURCES_DISAGREE)
    client = sides.client
    part = partition(
        # an outer server span (TGI's router behind a gateway, an HTTP server span) holds more
        server_ns=sides.server.duration_ns if sides.server is not None else server_ns,
        client_ns=client.duration_ns if client is not None else None,
        prefill_ns=prefill_ns,
        decode_ns=decode_ns or 0,
        queue_wait_ns=queue_ns,
        tokenize_ns=rd.rust_duration_ns(a.get(VALIDATION)) or 0,
    )
    prompt = rd.count(handler.attributes.get("gen_ai.usage.input_tokens"))
    out_attr = rd.count(handler.attributes.get("gen_ai.usage.output_tokens"))
    return build_summary(
        trace,
        handler,
        part,
        source=NAME,
        request_id=str(handler.attributes.get("request_id") or ""),
        related=below,
        client=client,
        server=sides.server,
        ttft_ms=None if ttft_ns is None else ttft_ns / NS_PER_MS,
        prompt_tokens=prompt,
        output_tokens=out_attr if out_attr is not None else output_tokens,
        token_offsets_ms=offsets_ms,
        flags=flags,
        reader=rd,
        decode_measured=decode_ns is not None,
    )


def _generated_tokens(inference_ns: int | None, per_token_ns: int | None) -> int | None:
    """Gives the generated tokens TGI counted: its time_per_token is inference_time
    divided by them (router/src/server.rs `generate_internal` /
    `generate_stream_internal`: `inference_time / generated_tokens`)."""
    if inference_ns is None or not per_token_ns:
        return None
    return max(1, round(inference_ns / per_token_ns))
