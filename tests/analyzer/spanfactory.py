"""Builds spans of each serving stack's convention, with known ground truth (DESIGN.md §3)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from tokentrace.analyzer.spans import (
    KIND_CLIENT,
    KIND_INTERNAL,
    KIND_SERVER,
    Span,
    SpanEvent,
    SpanLink,
)

MS = 1_000_000
_ids = itertools.count(1)


def new_id(width: int = 16) -> str:
    return f"{next(_ids):0{width}x}"


@dataclass
class Truth:
    """The buckets a trace was built with, in ms."""

    e2e: float
    queue: float
    prefill: float
    decode: float
    network: float | None = None
    ttft: float | None = None
    output_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def span(
    trace_id: str,
    name: str,
    start_ms: float,
    dur_ms: float,
    parent: Span | None = None,
    kind: int = KIND_INTERNAL,
    attrs: dict[str, Any] | None = None,
    resource: dict[str, Any] | None = None,
    events: list[SpanEvent] | None = None,
    links: list[SpanLink] | None = None,
    t0_ns: int = 1_700_000_000 * 10**9,
) -> Span:
    return Span(
        trace_id=trace_id,
        span_id=new_id(),
        parent_span_id=parent.span_id if parent else "",
        name=name,
        kind=kind,
        start_ns=t0_ns + round(start_ms * MS),
        end_ns=t0_ns + round((start_ms + dur_ms) * MS),
        attributes=attrs or {},
        resource=resource if resource is not None else (parent.resource if parent else {"service.name": "svc"}),
        events=events or [],
        links=links or [],
    )


def client_wrap(
    trace_id: str, server_start_ms: float, server_ms: float, wire_ms: float, t0_ns: int
) -> Span:
    """A GenAI client span around a server that took `server_ms`, `wire_ms` of wire in all."""
    return span(
        trace_id,
        "chat tiny",
        server_start_ms - wire_ms / 2,
        server_ms + wire_ms,
        kind=KIND_CLIENT,
        attrs={"gen_ai.operation.name": "chat"},
        resource={"service.name": "app"},
        t0_ns=t0_ns,
    )


def vllm_trace(
    queue: float, prefill: float, decode: float, *, tokens: int = 20, prompt: int = 100,
    wire: float | None = None, t0_ns: int = 1_700_000_000 * 10**9, disagree: bool = False,
    resource: dict[str, Any] | None = None,
) -> tuple[list[Span], Truth]:
    tid = new_id(32)
    e2e = queue + prefill + decode
    client = client_wrap(tid, 0, e2e, wire, t0_ns) if wire is not None else None
    attrs = {
        "gen_ai.latency.time_to_first_token": (queue + prefill) / 1000,
        "gen_ai.latency.e2e": e2e / 1000,
        "gen_ai.latency.time_in_queue": queue / 1000,
        "gen_ai.latency.time_in_model_prefill": prefill / 1000,
        "gen_ai.latency.time_in_model_decode": decode / 1000,
        "gen_ai.latency.time_in_model_inference": (prefill + decode) / 1000,
        "gen_ai.usage.prompt_tokens": prompt,
        "gen_ai.usage.completion_tokens": tokens,
        "gen_ai.request.id": f"cmpl-{tid[:8]}",
        "gen_ai.response.model": "llama",
    }
    dur = e2e * (1.5 if disagree else 1.0)
    srv = span(tid, "llm_request", 0, dur, parent=client, kind=KIND_SERVER, attrs=attrs,
               resource=resource or {"service.name": "vllm", "vllm.process_id": 4242}, t0_ns=t0_ns)
    spans = [srv] + ([client] if client else [])
    return spans, Truth(e2e + (wire or 0), queue, prefill, decode, wire, queue + prefill, tokens)


def sglang_trace(
    tokenize: float, wait: float, prefill: float, decode: float, *, other: float = 2.0,
    tokens: int = 16, wire: float | None = None, t0_ns: int = 1_700_000_000 * 10**9,
    prompt: int = 50,
) -> tuple[list[Span], Truth]:
    tid = new_id(16)  # SGLang's own 64-bit trace ids
    e2e = tokenize + wait + prefill + decode + other
    client = client_wrap(tid, 0, e2e, wire, t0_ns) if wire is not None else None
    attrs = {
        "gen_ai.latency.time_to_first_token": (tokenize + wait + prefill) / 1000,
        "gen_ai.latency.e2e": e2e / 1000,
        "gen_ai.latency.time_in_queue": wait / 1000,
        # SGLang's prefill attribute includes the queue wait
        "gen_ai.latency.time_in_model_prefill": (wait + prefill) / 1000,
        "gen_ai.latency.time_in_model_decode": decode / 1000,
        "gen_ai.usage.prompt_tokens": prompt,
        "gen_ai.usage.completion_tokens": tokens,
    }
    root = span(tid, f" Req {tid[:8]}", 0, e2e, parent=client, attrs=attrs,
                resource={"service.name": "sglang"}, t0_ns=t0_ns)
    tok_thread = span(tid, "Tokenizer (pid 7)", 0, tokenize, root, t0_ns=t0_ns)
    sched = span(tid, "Scheduler [TP 0] (pid 8)", tokenize, wait + prefill + decode, root, t0_ns=t0_ns)
    t = tokenize
    slices = [span(tid, "tokenize", 0, tokenize, tok_thread, t0_ns=t0_ns),
              span(tid, "prefill_waiting", t, wait, sched, t0_ns=t0_ns)]
    t += wait
    pf = span(tid, "prefill_forward", t, prefill, sched, t0_ns=t0_ns)
    chunk = span(tid, "chunked_prefill", t, prefill / 2, pf, t0_ns=t0_ns)
    t += prefill
    df = span(tid, "decode_forward", t, decode, sched, t0_ns=t0_ns)
    loop = span(tid, "decode_loop", t, decode, df, t0_ns=t0_ns)
    spans = [root, tok_thread, sched, *slices, pf, chunk, df, loop] + ([client] if client else [])
    return spans, Truth(e2e + (wire or 0), tokenize + wait + other, prefill, decode, wire,
                        tokenize + wait + prefill, tokens)


def rust(ms: float) -> str:
    """Formats ms the way Rust's Duration Debug does, picking the unit by size."""
    if ms >= 1000:
        return f"{ms / 1000:.9f}s"
    if ms >= 1:
        return f"{ms:.6f}ms"
    if ms >= 0.001:
        return f"{ms * 1000:.3f}µs"
    return f"{round(ms * 1e6)}ns"


def tgi_trace(
    validation: float, queue: float, prefill: float, itl: float, tokens: int, *,
    handler: str = "generate_stream", wire: float | None = None,
    t0_ns: int = 1_700_000_000 * 10**9, attrs_only: bool = False,
    gaps: list[float] | None = None,
) -> tuple[list[Span], Truth]:
    tid = new_id(32)
    gaps = gaps if gaps is not None else [itl] * (tokens - 1)
    decode = sum(gaps)
    e2e = validation + queue + prefill + decode
    client = client_wrap(tid, 0, e2e, wire, t0_ns) if wire is not None else None
    attrs = {
        "total_time": rust(e2e),
        "validation_time": rust(validation),
        "queue_time": rust(queue),
        "inference_time": rust(prefill + decode),
        "time_per_token": rust((prefill + decode) / tokens),
        "seed": "None",
    }
    h = span(tid, handler, 0, e2e, parent=client, attrs=attrs,
             resource={"service.name": "text-generation-inference.router"}, t0_ns=t0_ns)
    spans = [h] + ([client] if client else [])
    if not attrs_only:
        spans.append(span(tid, "queued", validation, queue, h, t0_ns=t0_ns))
        t = validation + queue
        for i in range(tokens):
            d = prefill if i == 0 else gaps[i - 1]
            spans.append(span(tid, "infer", t, d, h, t0_ns=t0_ns,
                              links=[SpanLink(new_id(32), new_id(), {})]))
            t += d
    truth_prefill = prefill
    truth_decode = decode
    if attrs_only:
        # without infer spans only time_per_token is known: the prefill is estimated as one step
        truth_prefill = (prefill + decode) / tokens
        truth_decode = prefill + decode - truth_prefill
    return spans, Truth(e2e + (wire or 0), validation + queue, truth_prefill, truth_decode, wire,
                        None if attrs_only else validation + queue + prefill, tokens)


def genai_client_trace(
    ttft: float, itl: float, tokens: int, *, style: str = "openllmetry",
    server_ms: float | None = None, t0_ns: int = 1_700_000_000 * 10**9,
) -> tuple[list[Span], Truth]:
    """A client-only trace: OpenLLMetry chunk events, OpenInference first-token event or GenAI ttfc."""
    tid = new_id(32)
    total = ttft + itl * (tokens - 1) + 1.0
    events: list[SpanEvent] = []
    attrs: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-x",
                             "gen_ai.usage.input_tokens": 30, "gen_ai.usage.output_tokens": tokens}
    chunk_name = {"openllmetry": "gen_ai.content.completion.chunk",
                  "openllmetry_old": "llm.content.completion.chunk"}.get(style)
    if chunk_name:
        events = [SpanEvent(chunk_name, t0_ns + round((ttft + i * itl) * MS)) for i in range(tokens)]
    elif style == "openinference":
        attrs = {"openinference.span.kind": "LLM", "llm.model_name": "gpt-x",
                 "llm.token_count.prompt": 30, "llm.token_count.completion": tokens}
        events = [SpanEvent("First Token Stream Event", t0_ns + round(ttft * MS))]
    else:
        attrs["gen_ai.response.time_to_first_chunk"] = ttft / 1000
    c = span(tid, "openai.chat", 0, total, kind=KIND_CLIENT if style != "openinference" else KIND_INTERNAL,
             attrs=attrs, resource={"service.name": "app"}, events=events, t0_ns=t0_ns)
    spans = [c]
    network = None
    if server_ms is not None:
        network = total - server_ms
        spans.append(span(tid, "POST /v1/chat/completions", network / 2, server_ms, c,
                          kind=KIND_SERVER, resource={"service.name": "gateway"}, t0_ns=t0_ns))
    # without chunk times a streamed answer decodes from its first chunk to the span's end
    decode = itl * (tokens - 1) if chunk_name else (total - ttft if tokens > 1 else 0.0)
    prefill = ttft - (network or 0.0)
    server = server_ms if server_ms is not None else total
    return spans, Truth(total, server - prefill - decode, prefill, decode, network, None, tokens)


def sdk_trace(
    tokenize: float, queue: float, prefill: float, itl: float, tokens: int, *,
    wire: float | None = None, offsets: bool = True, t0_ns: int = 1_700_000_000 * 10**9,
) -> tuple[list[Span], Truth]:
    """tokentrace's own SDK spans: a request span with phase children and packed token offsets."""
    from tokentrace.instrumentation import semconv as sc

    tid = new_id(32)
    decode = itl * (tokens - 1)
    e2e = tokenize + queue + prefill + decode
    first = tokenize + queue + prefill
    attrs: dict[str, Any] = {sc.REQUEST_ID: f"r-{tid[:8]}", sc.PROMPT_TOKENS: 40,
                             sc.OUTPUT_TOKENS: tokens, sc.REQUEST_MODEL: "llama"}
    if offsets:
        attrs[sc.TOKEN_OFFSETS_US] = sc.pack_list([round((first + i * itl) * 1000) for i in range(tokens)])
    client = None
    if wire is not None:
        client = span(tid, sc.SPAN_CLIENT, -wire / 2, e2e + wire, kind=KIND_CLIENT,
                      attrs={sc.CLIENT_CHUNK_OFFSETS_US: [round((first + wire / 2 + i * itl) * 1000)
                                                          for i in range(tokens)],
                             sc.CLIENT_TTFC_S: (first + wire / 2) / 1000},
                      resource={"service.name": "app"}, t0_ns=t0_ns)
    req = span(tid, sc.SPAN_REQUEST, 0, e2e, parent=client, kind=KIND_SERVER, attrs=attrs,
               resource={"service.name": "sdk-server", "service.instance.id": "i0"}, t0_ns=t0_ns)
    phases = [span(tid, sc.SPAN_TOKENIZE, 0, tokenize, req, t0_ns=t0_ns),
              span(tid, sc.SPAN_QUEUE, tokenize, queue, req, t0_ns=t0_ns),
              span(tid, sc.SPAN_PREFILL, tokenize + queue, prefill, req, t0_ns=t0_ns),
              span(tid, sc.SPAN_DECODE, first, decode, req, t0_ns=t0_ns)]
    spans = [req, *phases] + ([client] if client else [])
    return spans, Truth(e2e + (wire or 0), tokenize + queue, prefill, decode, wire, first, tokens)
