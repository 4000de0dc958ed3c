"""Builds spans of each serving stack's convention, with known ground truth (docs/design.md §3)."""

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


#: vLLM's resource (vllm/tracing/otel.py `init_tracer`; newest releases
#: vllm/foundation/observability/tracing/otel.py): the instrumenting module and the process
#: id, a string (`str(os.getpid())`); vLLM sets no service.name, so `Resource.create` gives
#: OTEL_SERVICE_NAME's, else the SDK's default `unknown_service:<python executable>`.
VLLM_RESOURCE = {"service.name": "unknown_service:python3", "vllm.instrumenting_module_name": "vllm.llm_engine",
                 "vllm.process_id": "4242"}


def vllm_trace(
    queue: float, prefill: float, decode: float, *, tokens: int = 20, prompt: int = 100,
    wire: float | None = None, t0_ns: int = 1_700_000_000 * 10**9, disagree: bool = False,
    resource: dict[str, Any] | None = None, v0: bool = False,
) -> tuple[list[Span], Truth]:
    """vLLM's `llm_request` span: the V1 engine's (vllm/v1/engine/output_processor.py
    `do_tracing`; it names no model), or with `v0` the V0 engine's (vllm/engine/llm_engine.py
    `create_trace_span`: `gen_ai.response.model`, no prefill/decode attributes, a
    `TracerProvider()` without resource)."""
    tid = new_id(32)
    e2e = queue + prefill + decode
    client = client_wrap(tid, 0, e2e, wire, t0_ns) if wire is not None else None
    attrs: dict[str, Any] = {
        "gen_ai.latency.time_to_first_token": (queue + prefill) / 1000,
        "gen_ai.latency.e2e": e2e / 1000,
        "gen_ai.latency.time_in_queue": queue / 1000,
        "gen_ai.usage.prompt_tokens": prompt,
        "gen_ai.usage.completion_tokens": tokens,
        "gen_ai.request.id": f"cmpl-{tid[-12:]}",  # unique, as vLLM's are (a uuid's hex)
    }
    if v0:
        attrs.update({"gen_ai.response.model": "llama", "gen_ai.request.temperature": 0.7,
                      "gen_ai.request.top_p": 1.0, "gen_ai.request.max_tokens": 256,
                      "gen_ai.request.n": 1, "gen_ai.usage.num_sequences": 1})
    else:
        attrs.update({"gen_ai.latency.time_in_model_prefill": prefill / 1000,
                      "gen_ai.latency.time_in_model_decode": decode / 1000,
                      "gen_ai.latency.time_in_model_inference": (prefill + decode) / 1000,
                      "gen_ai.response.finish_reasons": '["stop"]',
                      "gen_ai.request.max_tokens": 256, "gen_ai.request.n": 1})
    dur = e2e * (1.5 if disagree else 1.0)
    default = {"service.name": "unknown_service"} if v0 else dict(VLLM_RESOURCE)
    srv = span(tid, "llm_request", 0, dur, parent=client, kind=KIND_SERVER, attrs=attrs,
               resource=resource or default, t0_ns=t0_ns)
    spans = [srv] + ([client] if client else [])
    return spans, Truth(e2e + (wire or 0), queue, prefill, decode, wire, queue + prefill, tokens)


def sglang_trace(
    tokenize: float, wait: float, prefill: float, decode: float, *, other: float = 2.0,
    tokens: int = 16, wire: float | None = None, t0_ns: int = 1_700_000_000 * 10**9,
    prompt: int = 50, decode_wait: float | None = None,
) -> tuple[list[Span], Truth]:
    """SGLang unified (python/sglang/srt/observability/trace.py, req_time_stats.py): root
    `" Req <rid8>"`; the tokenizer thread's `tokenize`, `dispatch`; the scheduler's
    `request_process`, `prefill_waiting` (the wait), `prefill_forward` (`chunked_prefill`
    inside), `decode_waiting` (first token → first decode batch: decode time),
    `decode_forward` with one `decode_loop` per step.  `decode` is first → last token;
    `other` is spread over dispatch, request processing and the answer's way out."""
    tid = new_id(16)  # SGLang's own 64-bit trace ids
    rid = tid * 2  # the whole rid (a uuid's hex); its first 8 characters name the root
    e2e = tokenize + wait + prefill + decode + other
    client = client_wrap(tid, 0, e2e, wire, t0_ns) if wire is not None else None
    dispatch, process, finish = other / 4, other / 4, other / 2
    dw = min(decode / 10, 2.0) if decode_wait is None else decode_wait
    sched_start = tokenize + dispatch
    first = sched_start + process + wait + prefill  # the first token: prefill finished
    attrs: dict[str, Any] = {
        "rid": rid, "module": "sglang::request",
        # tokenizer_manager's span attributes (`convert_to_gen_ai_span_attrs` for the times)
        "gen_ai.usage.completion_tokens": tokens, "gen_ai.usage.prompt_tokens": prompt,
        "gen_ai.usage.cached_tokens": 0, "gen_ai.request.id": rid,
        "gen_ai.request.max_tokens": 256, "gen_ai.response.model": "qwen",
        "gen_ai.response.finish_reasons": '["stop"]',
        "gen_ai.latency.time_to_first_token": first / 1000,
        "gen_ai.latency.e2e": e2e / 1000,
        "gen_ai.latency.time_in_model_decode": (e2e - first) / 1000,
        "gen_ai.latency.time_in_model_inference": (e2e - sched_start) / 1000,
        # first token − dispatch: the queue wait is inside it
        "gen_ai.latency.time_in_model_prefill": (first - sched_start) / 1000,
    }
    root = span(tid, f" Req {rid[:8]}", 0, e2e, parent=client, attrs=attrs,
                resource={"service.name": "sglang"}, t0_ns=t0_ns)
    host = "0a1b2c3d4e5f60718293a4b5c6d7e8f9"
    tok_thread = span(tid, f"Tokenizer(host:{host[:8]} | pid:7)", 0, sched_start, root,
                      attrs={"host_id": host, "pid": 7, "thread_label": "Tokenizer"}, t0_ns=t0_ns)
    sched = span(tid, f"Scheduler [TP 0] (host:{host[:8]} | pid:8)", sched_start,
                 e2e - finish - sched_start, root,
                 attrs={"tp_rank": 0, "host_id": host, "pid": 8, "thread_label": "Scheduler"},
                 t0_ns=t0_ns)
    slices = [span(tid, "tokenize", 0, tokenize, tok_thread, t0_ns=t0_ns),
              span(tid, "dispatch", tokenize, dispatch, tok_thread, t0_ns=t0_ns)]
    t = sched_start
    for name, dur in (("request_process", process), ("prefill_waiting", wait)):
        slices.append(span(tid, name, t, dur, sched, t0_ns=t0_ns))
        t += dur
    pf = span(tid, "prefill_forward", t, prefill, sched, t0_ns=t0_ns)
    chunk = span(tid, "chunked_prefill", t, prefill, pf, t0_ns=t0_ns)
    t += prefill
    spans = [root, tok_thread, sched, *slices, pf, chunk]
    if tokens > 1:
        spans.append(span(tid, "decode_waiting", t, dw, sched, t0_ns=t0_ns))
        t += dw
        df = span(tid, "decode_forward", t, decode - dw, sched, t0_ns=t0_ns)
        spans.append(df)
        step = (decode - dw) / (tokens - 1)
        for i in range(tokens - 1):
            spans.append(span(tid, "decode_loop", t + i * step, step, df, attrs={"decode_ct": i},
                              t0_ns=t0_ns))
    spans += [client] if client else []
    return spans, Truth(e2e + (wire or 0), tokenize + wait + other, prefill, decode, wire,
                        first, tokens)


def rust(ms: float) -> str:
    """Formats ms the way Rust's Duration Debug does, picking the unit by size."""
    if ms >= 1000:
        return f"{ms / 1000:.9f}s"
    if ms >= 1:
        return f"{ms:.6f}ms"
    if ms >= 0.001:
        return f"{ms * 1000:.3f}µs"
    return f"{round(ms * 1e6)}ns"


#: The routes of TGI's handlers (router/src/server.rs).
TGI_ROUTES = {"generate": "/generate", "generate_stream": "/generate_stream",
              "chat_completions": "/v1/chat/completions", "completions": "/v1/completions"}
#: The time (ms) axum's OpenTelemetry layer spends on each side of the handler.
TGI_HTTP_MS = 0.05


def tgi_trace(
    validation: float, queue: float, prefill: float, itl: float, tokens: int, *,
    handler: str = "generate_stream", wire: float | None = None,
    t0_ns: int = 1_700_000_000 * 10**9, attrs_only: bool = False,
    gaps: list[float] | None = None,
) -> tuple[list[Span], Truth]:
    """TGI's router (router/src/server.rs, infer/mod.rs, queue.rs): axum's `POST /…` SERVER
    span → the handler (the timing fields) → `async_stream` (streamed answers; `generate`
    goes through `Infer::generate` instead) → `generate_stream` (`Infer::generate_stream`)
    → `validate`, `schedule` → `queued` and one `infer` per forward step.  `spans[0]` is
    the handler.  `attrs_only`: a sender that dropped the `queued` and `infer` spans."""
    tid = new_id(32)
    gaps = gaps if gaps is not None else [itl] * (tokens - 1)
    decode = sum(gaps)
    e2e = validation + queue + prefill + decode
    server = e2e + 2 * TGI_HTTP_MS
    client = client_wrap(tid, -TGI_HTTP_MS, server, wire, t0_ns) if wire is not None else None
    attrs = {
        "total_time": rust(e2e),
        "validation_time": rust(validation),
        "queue_time": rust(queue),
        "inference_time": rust(prefill + decode),
        "time_per_token": rust((prefill + decode) / tokens),
        "seed": "None",
    }
    if handler in ("generate", "generate_stream"):
        attrs["parameters"] = "GenerateParameters { best_of: None, temperature: None, max_new_tokens: Some(64) }"
    res = {"service.name": "text-generation-inference.router"}
    route = TGI_ROUTES.get(handler, "/generate")
    http = span(tid, f"POST {route}", -TGI_HTTP_MS, server, parent=client, kind=KIND_SERVER,
                attrs={"http.request.method": "POST", "http.route": route, "url.path": route,
                       "http.response.status_code": 200},
                resource=res, t0_ns=t0_ns)
    h = span(tid, handler, 0, e2e, http, attrs=attrs, t0_ns=t0_ns)
    if handler == "generate":  # Infer::generate → Infer::generate_stream
        outer = span(tid, "generate", 0, e2e, h, t0_ns=t0_ns)
    else:  # info_span!(parent: &span, "async_stream") around Infer::generate_stream
        outer = span(tid, "async_stream", 0, e2e, h, t0_ns=t0_ns)
    infer_side = span(tid, "generate_stream", 0, e2e, outer, t0_ns=t0_ns)
    validate = span(tid, "validate", 0, validation, infer_side, t0_ns=t0_ns)
    schedule = span(tid, "schedule", validation, e2e - validation, infer_side, t0_ns=t0_ns)
    spans = [h] + ([client] if client else []) + [http, outer, infer_side, validate, schedule]
    if not attrs_only:
        spans.append(span(tid, "queued", validation, queue, schedule, t0_ns=t0_ns))
        t = validation + queue
        for i in range(tokens):
            d = prefill if i == 0 else gaps[i - 1]
            spans.append(span(tid, "infer", t, d, schedule, t0_ns=t0_ns,
                              links=[SpanLink(new_id(32), new_id(), {})]))
            t += d
    truth_prefill = prefill
    truth_decode = decode
    if attrs_only:
        # without infer spans only time_per_token is known: the prefill is estimated as one step
        truth_prefill = (prefill + decode) / tokens
        truth_decode = prefill + decode - truth_prefill
    return spans, Truth(server + (wire or 0), validation + queue + 2 * TGI_HTTP_MS, truth_prefill,
                        truth_decode, wire, None if attrs_only else validation + queue + prefill,
                        tokens)


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
