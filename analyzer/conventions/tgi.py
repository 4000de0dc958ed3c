"""Adapter for Hugging Face TGI's router spans (docs/design.md §3).

The handler span (`generate`, `generate_stream`, `chat_completions`,
`completions`; kind INTERNAL) carries Rust `Duration` Debug strings: `total_time`,
`validation_time`, `queue_time`, `inference_time`, `time_per_token`.  TGI records
them only when the answer ends well (router/src/server.rs: the `span.record` calls
sit in the `InferStreamResponse::End` arm of `generate_stream_internal`, at the end
of `generate_internal`): a client that leaves mid-stream, a generation error, a 429
(overloaded) or a 422 (validation) leaves the handler without them.

Below the handler TGI nests its own spans: `async_stream` (`info_span!(parent: &span,
"async_stream")`, streamed answers) → `generate_stream` (`Infer::generate_stream`,
`#[instrument(skip_all)]`; under `generate` → `Infer::generate` for `/generate`) →
`validate`, `schedule` → `queued` (the queue wait) and one `infer` span per forward
step, the first being the prefill (`info_span!(parent: &entry.span, …)` in the
queue).  TGI records no TTFT; it is the end of the first `infer` step.  Batches are
separate traces linked from `infer` (see `analyzer/engine_steps.py`).  Failures are
`tracing::error!` events, which set the span's status to ERROR.

By default the handler is the trace's root, or the child of the caller's span whose
traceparent came in (TGI PR #2648): axum's OpenTelemetry layer makes its `POST /…`
SERVER span at TRACE level (tracing-opentelemetry-instrumentation-sdk), which TGI's
default log filter (`info`) drops.  Where it is exported, it holds the handler.

`/v1/completions` with several prompts runs one generation per prompt
(`generate_stream_internal` / `generate_internal`, each given a clone of the handler's
span): one `async_stream` (or `Infer::generate`) branch per prompt under the one
handler, side by side, and each prompt's `span.record` of the timing fields lands on
the handler, the last one's winning.  It is one request (one row): its queue wait is
the wait before its first prompt was scheduled, its tokens all the prompts' infer steps,
its TPOT and ITL each prompt's stream's.
"""

from __future__ import annotations

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.buckets import NS_PER_MS, partition
from tokentrace.analyzer.conventions._common import agree, below_by_child, build_summary, inside_any
from tokentrace.analyzer.conventions._sides import RequestSides, Sides
from tokentrace.analyzer.conventions._values import ValueReader
from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.trace_view import TraceView

NAME = "tgi"
HANDLERS = frozenset({"generate", "generate_stream", "chat_completions", "completions"})
SPAN_QUEUED = "queued"
SPAN_INFER = "infer"
SPAN_ASYNC_STREAM = "async_stream"
SPAN_VALIDATE = "validate"
#: `Infer::generate` / `Infer::generate_stream` (router/src/infer/mod.rs): handler names.
INFER_GENERATE = "generate"
INFER_GENERATE_STREAM = "generate_stream"
#: Spans only TGI's router makes below a handler: one of them marks a handler as TGI's
#: when the timing fields are missing.
INNER_SPANS = frozenset({SPAN_QUEUED, SPAN_INFER, SPAN_ASYNC_STREAM})
#: TGI's default `--otlp-service-name`.
SERVICE_PREFIX = "text-generation-inference"
TOTAL = "total_time"
VALIDATION = "validation_time"
QUEUE = "queue_time"
INFERENCE = "inference_time"
PER_TOKEN = "time_per_token"
TIMING_KEYS = (TOTAL, QUEUE, INFERENCE)
FIELDS = (TOTAL, VALIDATION, QUEUE, INFERENCE, PER_TOKEN)
#: The value tracing-opentelemetry gives an event's `level` attribute for `tracing::error!`.
LEVEL = "level"
LEVEL_ERROR = "ERROR"


def summarize(trace: TraceView) -> list[s.RequestSummary]:
    infer_side = _infer_side(trace)
    # the handler is the outermost: compat_generate / sagemaker call the handlers' functions
    # (a handler inside a handler), and Infer's own spans carry handler names
    nested = inside_any(trace, lambda x: x.name in HANDLERS and id(x) not in infer_side)
    above_tgi = _above_tgi_spans(trace, infer_side)
    handlers = [
        x
        for x in trace.spans
        if x.name in HANDLERS
        and id(x) not in infer_side
        and not nested(x)
        and _is_tgi(x, above_tgi)
    ]
    sides = RequestSides(trace, [[x] for x in handlers])
    return [_summarize(trace, x, sides.of(x)) for x in handlers]


def _infer_side(trace: TraceView) -> set[int]:
    """Gives (by `id`) the spans of `Infer` that carry handler names: `Infer::generate`
    under a handler (`/generate`, and the non-streamed chat and completions), and
    `Infer::generate_stream` under `async_stream` or under `Infer::generate`.  They are
    steps of the request, never a request of their own."""
    by_id = trace.by_id
    found: set[int] = set()
    for x in trace.spans:
        if x.name != INFER_GENERATE and x.name != INFER_GENERATE_STREAM:
            continue
        parent = by_id.get(x.parent_span_id)
        if parent is None or parent is x:
            continue
        if x.name == INFER_GENERATE:
            if parent.name in HANDLERS:
                found.add(id(x))
        elif parent.name == SPAN_ASYNC_STREAM or parent.name == INFER_GENERATE:
            found.add(id(x))
    return found


def _above_tgi_spans(trace: TraceView, infer_side: set[int]) -> set[str]:
    """Gives the ids of the spans above one of TGI's own inner spans (`INNER_SPANS`, or
    `Infer::generate_stream`, which every request that reached `Infer` goes through).
    Each walk up stops at a span an earlier one passed, so the whole costs the trace's
    spans once, loops of parent ids included."""
    by_id = trace.by_id
    above: set[str] = set()
    for x in trace.spans:
        if x.name not in INNER_SPANS and not (
            x.name == INFER_GENERATE_STREAM and id(x) in infer_side
        ):
            continue
        parent = by_id.get(x.parent_span_id)
        while parent is not None and parent.span_id not in above:
            above.add(parent.span_id)
            parent = by_id.get(parent.parent_span_id)
    return above


def _is_tgi(handler: Span, above_tgi: set[str]) -> bool:
    # the timing fields (a request that ended well), else TGI's own spans below it (a
    # failed or abandoned one: the fields are recorded only at the end), else TGI's
    # service name (a request refused before it reached `Infer`)
    return (
        any(k in handler.attributes for k in TIMING_KEYS)
        or handler.span_id in above_tgi
        or handler.service_name.startswith(SERVICE_PREFIX)
    )


def _summarize(trace: TraceView, handler: Span, sides: Sides) -> s.RequestSummary:
    a: dict[str, object] = {}
    branches = below_by_child(trace, handler)
    below = [x for branch in branches for x in branch]
    # the timing fields may sit on a handler-named span below (a handler called by another)
    for span in [*(x for x in below if x.name in HANDLERS), handler]:
        a.update({k: v for k, v in span.attributes.items() if k in FIELDS})
    rd = ValueReader()
    flags: list[str] = []
    total_ns = rd.rust_duration_ns(a.get(TOTAL))
    if total_ns is not None and not agree(total_ns, handler.duration_ns):
        flags.append(s.FLAG_SOURCES_DISAGREE)
    infers = sorted((x for x in below if x.name == SPAN_INFER), key=lambda x: x.start_ns)
    queued = [x for x in below if x.name == SPAN_QUEUED]
    # the handler's prompts: /v1/completions with several runs one generation per prompt,
    # each under the one handler, side by side (router/src/server.rs `completions`)
    prompts = [b for b in branches if any(x.name == SPAN_INFER or x.name == SPAN_QUEUED for x in b)]
    several = len(prompts) > 1
    inference_ns = rd.rust_duration_ns(a.get(INFERENCE))
    per_token_ns = rd.rust_duration_ns(a.get(PER_TOKEN))
    ttft_ns: int | None = None
    decode_ns: int | None
    offsets_ms: list[float] = []
    output_tokens: int | None
    stream_tokens: list[int] = []
    if infers and several:
        # each prompt's `span.record` of the timing fields lands on the one handler, the
        # last one's winning: they time one prompt; the infer steps count each prompt's
        stream_tokens = [n for n in (sum(x.name == SPAN_INFER for x in b) for b in prompts) if n]
        ends = sorted(x.end_ns for x in infers)
        prefill_ns = infers[0].duration_ns
        decode_ns = ends[-1] - ends[0]
        ttft_ns = ends[0] - handler.start_ns
        offsets_ms = _prompts_offsets_ms(handler, prompts)
        output_tokens = sum(stream_tokens)
    elif infers:
        # each infer step ends with one token: server-side token times
        ends = sorted(x.end_ns for x in infers)
        prefill_ns = infers[0].duration_ns
        decode_ns = ends[-1] - ends[0]
        ttft_ns = ends[0] - handler.start_ns
        offsets_ms = [(e - handler.start_ns) / NS_PER_MS for e in ends]
        # one infer span per forward step; with speculative decoding (--speculate)
        # a step yields several tokens, so the timing fields count them when present
        output_tokens = _generated_tokens(inference_ns, per_token_ns) or len(infers)
    elif a:
        # the fields, recorded when an answer ended, without the infer spans (a sender
        # that dropped them): prefill ≈ one time_per_token, decode the rest of inference
        flags.append(s.FLAG_NO_TOKEN_TIMES)
        output_tokens = _generated_tokens(inference_ns, per_token_ns)
        prefill_ns = per_token_ns or 0
        decode_ns = None if inference_ns is None else max(0, inference_ns - prefill_ns)
    else:
        # neither the fields nor an infer step: no inference ran, refused (429 overloaded,
        # 422 validation) or left while queued; the server's time and its queue are known
        flags.append(s.FLAG_NO_INFERENCE)
        output_tokens, prefill_ns, decode_ns = None, 0, None
    queue_attr_ns = rd.rust_duration_ns(a.get(QUEUE))
    # the prompts wait side by side: the call waits until its first prompt is scheduled;
    # the other prompts' waits lie inside its prefill and decode (one timeline, as vLLM's
    # prompts and samples: docs/conventions.md, "Fan-out")
    if queued and several:
        queue_ns = min(sum(x.duration_ns for x in b if x.name == SPAN_QUEUED) for b in prompts)
    else:
        queue_ns = _longest(branches, SPAN_QUEUED) if queued else queue_attr_ns or 0
    if queued and not several and queue_attr_ns is not None and not agree(queue_ns, queue_attr_ns):
        flags.append(s.FLAG_SOURCES_DISAGREE)
    validation_ns = rd.rust_duration_ns(a.get(VALIDATION))
    if validation_ns is None:  # the field is recorded at the end only: the span's time
        validation_ns = _longest(branches, SPAN_VALIDATE)
    client = sides.client
    part = partition(
        # an outer server span (TGI's own axum span, a gateway's) holds more
        server_ns=sides.server_ns(handler.duration_ns),
        client_ns=client.duration_ns if client is not None else None,
        prefill_ns=prefill_ns,
        decode_ns=decode_ns or 0,
        queue_wait_ns=queue_ns,
        tokenize_ns=validation_ns,
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
        error=any(_logged_an_error(x) for x in [handler, *below]),
        stream_tokens=stream_tokens,
    )


def _longest(branches: list[list[Span]], name: str) -> int:
    """Gives the time the spans named `name` took in the handler's branch that took the
    longest: its prompts run side by side (one branch each), a prompt's spans one after
    another."""
    return max((sum(x.duration_ns for x in b if x.name == name) for b in branches), default=0)


def _prompts_offsets_ms(handler: Span, prompts: list[list[Span]]) -> list[float]:
    """Gives token times (ms from the handler's start) whose gaps are each prompt's
    inter-token gaps: the prompts' streams laid end to end, the first from its first token.

    Merged in time order, the streams' tokens would interleave into gaps no stream had
    (two tokens of two prompts a microsecond apart).  Only the gaps are read from them
    (`apply_token_times`), and the first token time, which is the request's.
    """
    streams = [sorted(x.end_ns for x in b if x.name == SPAN_INFER) for b in prompts]
    streams = [ends for ends in streams if ends]
    streams.sort(key=lambda ends: ends[0])
    at = (streams[0][0] - handler.start_ns) / NS_PER_MS
    offsets = [at]
    for ends in streams:
        for a, b in zip(ends, ends[1:], strict=False):
            at += (b - a) / NS_PER_MS
            offsets.append(at)
    return offsets


def _logged_an_error(span: Span) -> bool:
    """True when `tracing::error!` was logged in `span` (an event at level ERROR): a
    sender that dropped the status it sets still keeps the event."""
    return any(e.attributes.get(LEVEL) == LEVEL_ERROR for e in span.events)


def _generated_tokens(inference_ns: int | None, per_token_ns: int | None) -> int | None:
    """Gives the generated tokens TGI counted: its time_per_token is inference_time
    divided by them (router/src/server.rs `generate_internal` /
    `generate_stream_internal`: `inference_time / generated_tokens`)."""
    if inference_ns is None or not per_token_ns:
        return None
    return max(1, round(inference_ns / per_token_ns))
