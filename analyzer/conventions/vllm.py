"""Adapter for vLLM's `llm_request` span (V1 engine, 0.11+; V0 engine; docs/design.md §3).

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
first), and the resource (`init_tracer`, vllm/tracing/otel.py; in the newest releases
vllm/foundation/observability/tracing/otel.py) holds only `vllm.instrumenting_module_name`
and `vllm.process_id`: vLLM sets no `service.name`, so `Resource.create` takes
`OTEL_SERVICE_NAME` (or `OTEL_RESOURCE_ATTRIBUTES`), else the SDK's default
`unknown_service:<python executable>`.  The model then reads as the service name,
flagged `model_unnamed`; `OTEL_RESOURCE_ATTRIBUTES=gen_ai.request.model=…` on the
server names it.  Nothing here depends on the service name.

With parallel sampling (`n` > 1) the V1 engine runs one child request per sample
(vllm/v1/engine/parallel_sampling.py `ParentRequest`), each traced by its own
`do_tracing`: one trace holds n `llm_request` spans with the request's one
`gen_ai.request.id` (its external id) and one arrival; their `gen_ai.request.n` is the
child's, 1.  They are one request (one row, as the store's rows are one per trace and
request id): see `_requests` and `_merge`.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class _Call:
    """One call the user made: its id and, per prompt it sent, the spans of that
    prompt's samples (docs/conventions.md, "Fan-out": one row per call)."""

    request_id: str
    prompts: list[list[Span]]

    @property
    def spans(self) -> list[Span]:
        return [x for samples in self.prompts for x in samples]


def summarize(trace: TraceView) -> list[s.RequestSummary]:
    calls = _calls(_requests(trace))
    sides = RequestSides(trace, [c.spans for c in calls])
    return [_summarize(trace, c, sides.of(c.prompts[0][0])) for c in calls]


def _requests(trace: TraceView) -> list[list[Span]]:
    """Gives the spans of each request: the samples of one request (n > 1) share its
    `gen_ai.request.id` (the external id, `do_tracing`), its arrival (each child is a copy
    of the request, `AsyncLLM.add_request`) and its caller's span (the request's trace
    headers).  Two calls that share an id (a client's `X-Request-Id`) arrive apart: they
    stay two requests.  A span without an id is a request of its own."""
    requests: list[list[Span]] = []
    by_key: dict[tuple[str, int, str], list[Span]] = {}
    for x in trace.spans:
        if x.name != SPAN_NAME or not _is_vllm(x):
            continue
        request_id = str(x.attributes.get(REQUEST_ID) or "")
        key = (request_id, x.start_ns, x.parent_span_id)
        samples = by_key.get(key) if request_id else None
        if samples is None:
            samples = [x]
            requests.append(samples)
            if request_id:
                by_key[key] = samples
        else:
            samples.append(x)
    return requests


def _calls(requests: list[list[Span]]) -> list[_Call]:
    """Gives the calls the requests were made in: the prompts of one completions call
    are one call.  vLLM runs each prompt of `/v1/completions` as a request of its own
    (`OpenAIServingCompletion`: the call's id and `-{i}`, the prompt's index), each
    traced with the call's trace headers: their spans share the caller's span and the
    id before `-{i}`, the indices from 0 each once.  Anything else is a call of its own."""
    by_call: dict[tuple[str, str], list[tuple[int, list[Span]]]] = {}
    for samples in requests:
        first = samples[0]
        prompt = _prompt_of(str(first.attributes.get(REQUEST_ID) or ""))
        if prompt is not None and first.parent_span_id:
            base, index = prompt
            by_call.setdefault((first.parent_span_id, base), []).append((index, samples))
    folded: dict[int, _Call] = {}  # by id() of a call's first prompt's samples
    for (_, base), prompts in by_call.items():
        indices = [i for i, _ in prompts]
        if len(prompts) > 1 and 0 in indices and len(set(indices)) == len(indices):
            prompts.sort(key=lambda p: p[0])
            call = _Call(base, [samples for _, samples in prompts])
            for _, samples in prompts:
                folded[id(samples)] = call
    calls: list[_Call] = []
    for samples in requests:
        folded_into = folded.get(id(samples))
        if folded_into is None:
            calls.append(_Call(str(samples[0].attributes.get(REQUEST_ID) or ""), [samples]))
        elif folded_into.prompts[0] is samples:
            calls.append(folded_into)
    return calls


def _prompt_of(request_id: str) -> tuple[str, int] | None:
    """Gives (the call's id, the prompt's index) of a request id that ends in `-{i}`."""
    base, dash, index = request_id.rpartition("-")
    if dash and base and index.isdecimal() and index.isascii() and len(index) < 10:
        return base, int(index)
    return None


def _is_vllm(span: Span) -> bool:
    # any of its gen_ai attributes: one missing (e2e, say) must not lose the request
    return E2E in span.attributes or any(k.startswith("gen_ai.") for k in span.attributes)


@dataclass(frozen=True, slots=True)
class _Phases:
    """What one `llm_request` span (or the samples of one request together) says, in ns:
    `end_ns` is where the server's time ends (its start plus e2e)."""

    start_ns: int
    end_ns: int
    queue_wait_ns: int
    prefill_ns: int
    decode_ns: int | None
    ttft_ns: int | None


def _summarize(trace: TraceView, call: _Call, sides: Sides) -> s.RequestSummary:
    rd = ValueReader()
    flags: list[str] = []
    samples = call.spans
    phases = _merge([_read(x, rd, flags) for x in samples])
    counts = [rd.count(x.attributes.get(COMPLETION_TOKENS)) for x in samples]
    tokens = [n for n in counts if n is not None] if None not in counts else []
    # each prompt's samples share its prompt: counted once a prompt
    prompts = [rd.count(p[0].attributes.get(PROMPT_TOKENS)) for p in call.prompts]
    client = sides.client
    part = partition(
        # the attributes share one clock; the e2e attribute is their whole, unless an
        # outer server span (the API server's HTTP span, a gateway's) holds more
        server_ns=sides.server_ns(phases.end_ns - phases.start_ns),
        client_ns=client.duration_ns if client is not None else None,
        prefill_ns=phases.prefill_ns,
        decode_ns=phases.decode_ns or 0,
        queue_wait_ns=phases.queue_wait_ns,
    )
    span = samples[0]
    return build_summary(
        trace,
        span,
        part,
        source=NAME,
        request_id=call.request_id,
        related=samples[1:],
        client=client,
        server=sides.server,
        ttft_ms=None if phases.ttft_ns is None else phases.ttft_ns / NS_PER_MS,
        prompt_tokens=None if None in prompts else sum(n for n in prompts if n is not None),
        # the samples' tokens together: what the request produced
        output_tokens=sum(tokens) if tokens else None,
        flags=[*flags, s.FLAG_NO_TOKEN_TIMES],
        reader=rd,
        decode_measured=phases.decode_ns is not None,
        stream_tokens=tokens,
    )


def _read(span: Span, rd: ValueReader, flags: list[str]) -> _Phases:
    """Gives what one `llm_request` span says; `flags` gets what its values call for."""
    a = span.attributes
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
    if ttft_ns is not None and decode_ns is not None:
        # TTFT (server) is queue + prefill: the server's time less the decode.  vLLM's own
        # figure is the front end's clock (first output there − arrival), its decode the
        # engine core's (last − first token): they differ by how much later the front
        # end saw the last token than the first (-29 to +14 ms on tests/data/engines).
        # The engine's figure stays on its span (docs/conventions.md, "Which clock").
        ttft_ns = max(0, server_ns - decode_ns)
    return _Phases(
        span.start_ns, span.start_ns + server_ns, queue_wait_ns, prefill_ns, decode_ns, ttft_ns
    )


def _merge(samples: list[_Phases]) -> _Phases:
    """Gives the phases of a request from its samples' (n > 1; one sample's as they are).

    The samples decode side by side, each span from the request's arrival: the server's
    time runs from the first sample's start to the last one's end.  On that time line
    each sample's first token comes at its start + TTFT, its prefill ends there and its
    decode begins: prefill runs from the first sample scheduled to the first token of
    any, decode from there to the last token of any (docs/design.md §2), and the queue wait
    is the wait for the first sample to be scheduled.  Without a sample's TTFT the time
    line is not known: the sample that ended last stands for the request.
    """
    if len(samples) == 1:
        return samples[0]
    start_ns = min(x.start_ns for x in samples)
    end_ns = max(x.end_ns for x in samples)
    firsts = [None if x.ttft_ns is None else x.start_ns - start_ns + x.ttft_ns for x in samples]
    if None in firsts:
        last = max(samples, key=lambda x: x.end_ns)
        return _Phases(
            start_ns, end_ns, last.queue_wait_ns, last.prefill_ns, last.decode_ns, last.ttft_ns
        )
    timed = [(first, x) for first, x in zip(firsts, samples, strict=True) if first is not None]
    first_token_ns = min(first for first, _ in timed)
    scheduled_ns = min(first - x.prefill_ns for first, x in timed)
    lasts = [first + x.decode_ns for first, x in timed if x.decode_ns is not None]
    return _Phases(
        start_ns,
        end_ns,
        queue_wait_ns=min(x.queue_wait_ns for x in samples),
        prefill_ns=max(0, first_token_ns - scheduled_ns),
        decode_ns=max(0, max(lasts) - first_token_ns) if lasts else None,
        ttft_ns=first_token_ns,
    )


def _v0_phases(ttft_ns: int, queue_wait_ns: int, server_ns: int) -> tuple[int, int]:
    """Gives (prefill, decode) of a V0-engine span, which has no prefill/decode attributes.

    V0's time_in_queue is first_scheduled − arrival and its TTFT first_token −
    arrival (vllm/engine/llm_engine.py `create_trace_span`; V0 engine): what
    lies between is the prefill; what follows the first token is the decode.
    """
    return max(0, ttft_ns - queue_wait_ns), max(0, server_ns - ttft_ns)
