"""What every adapter shares: the request's who/what metadata and the summary assembly.

Adapters differ in how they find the buckets; once they have a `Partition`
the rest (model, tenant, traffic class, environment, client side, ITL, TPOT)
is the same for every convention, so it lives here once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.buckets import NS_PER_MS, Partition
from tokentrace.analyzer.conventions._client_times import best_token_times, read_client_times
from tokentrace.analyzer.conventions._values import MAX_INT64, ValueReader
from tokentrace.analyzer.itl import apply_token_times, apply_tpot
from tokentrace.analyzer.spans import STATUS_ERROR, Span
from tokentrace.analyzer.trace_view import (
    CONTEXT_KEYS,
    TraceView,
    instance_of,
)
from tokentrace.instrumentation import semconv as sc

TRAFFIC_CLASSES = (sc.TRAFFIC_INTERACTIVE, sc.TRAFFIC_BATCH)

#: Two measurements of one duration agree when within this much (ms) or this fraction.
AGREE_MS = 5.0
AGREE_FRACTION = 0.05


def rust_duration_ns(value: object) -> int | None:
    """Gives a Rust `Duration` Debug string ("3.104512345s", "12.3ms", "123.456µs", "789ns") as ns."""
    return ValueReader().rust_duration_ns(value)


def agree(a_ns: int, b_ns: int) -> bool:
    """True when two measurements of one duration agree within AGREE_MS / AGREE_FRACTION."""
    diff = abs(a_ns - b_ns) / NS_PER_MS
    return diff <= AGREE_MS or diff <= AGREE_FRACTION * max(abs(a_ns), abs(b_ns)) / NS_PER_MS


def _traffic_class(value: Any, rd: ValueReader) -> str:
    """Gives the request's traffic class, `interactive` or `batch` (docs/design.md §3), in any case
    and spacing; anything else is read as `interactive` and flagged (stored as sent, it
    matched neither class filter and showed as a class of its own)."""
    text = str(value).strip().lower() if value else ""
    if text in TRAFFIC_CLASSES:
        return text
    if text:
        rd.flag(s.FLAG_IMPOSSIBLE_VALUE)
    return sc.TRAFFIC_INTERACTIVE


def build_summary(
    trace: TraceView,
    root: Span,
    part: Partition,
    *,
    source: str,
    request_id: str,
    related: Sequence[Span] = (),
    client: Span | None = None,
    server: Span | None = None,
    ttft_ms: float | None = None,
    prompt_tokens: int | None = None,
    output_tokens: int | None = None,
    token_offsets_ms: Sequence[float] = (),
    token_times_source: str = s.TOKEN_TIMES_SERVER,
    flags: Sequence[str] = (),
    cold_start: bool = False,
    extra_model_keys: Sequence[str] = (),
    reader: ValueReader | None = None,
    decode_measured: bool = True,
    error: bool = False,
    stream_tokens: Sequence[int] = (),
) -> s.RequestSummary:
    """Gives the summary of `root` (the request's own server-side span) with `part` applied.

    `client` is the user's client span, `server` the span above `root` that timed the
    server side (a gateway's, an HTTP server's; `_sides.py`), None when `root` did.
    `reader` is the one the adapter read the request's attributes with: the flags
    its values call for are the request's.  `decode_measured`: False when the decode
    bucket is 0 for want of a measure (then there is no TPOT either).  `error`: the
    adapter's own word that the request failed (besides an ERROR status on its spans).
    `stream_tokens`: each stream's output tokens, when the answer is several streams
    decoded side by side (vLLM's n > 1 samples, TGI's prompts of one completions call).
    `token_offsets_ms` are the adapter's token times, `token_times_source` says whose;
    without them the client span's chunks stand in (docs/buckets.md).
    """
    rd = reader if reader is not None else ValueReader()
    outer = [x for x in (server, client) if x is not None]
    spans = [root, *related, *outer]
    first = _first_attr(spans)
    model = first((sc.REQUEST_MODEL, sc.RESPONSE_MODEL, *extra_model_keys), "")
    if not model:
        # vLLM's V1 engine and TGI name no model on their spans: the service name stands
        # in, and the flag says so (a model column that reads `unknown_service:python3`,
        # vLLM's default, or `text-generation-inference.router`)
        flags = [*flags, s.FLAG_MODEL_UNNAMED]
    # the request's own spans and resource first, then the spans around it: the
    # application's span that wraps the call (`handle_request` with `tenant.id`)
    context = [first(keys, "") for keys in CONTEXT_KEYS]
    if not all(context):
        around = trace.inherited(root, CONTEXT_KEYS)
        context = [own or above or "" for own, above in zip(context, around, strict=True)]
    tenant, traffic, environment = context
    traffic = _traffic_class(traffic, rd)
    instance, instance_id = instance_of(root.attributes, root.resource)
    gpu_mem = rd.count(root.attributes.get(sc.GPU_MEM_MAX_BYTES))
    if gpu_mem is not None and not 0 <= gpu_mem <= MAX_INT64:
        gpu_mem = None
        rd.flag(s.FLAG_IMPOSSIBLE_COUNT)
    if any(x.end_ns < x.start_ns for x in spans):
        rd.flag(s.FLAG_IMPOSSIBLE_VALUE)  # a span that ends before it starts: zero-length
    top = trace.top(root)  # remembered per trace: n requests in a chain cost n, not n^2
    if top.parent_span_id and top.parent_span_id not in trace.by_id:
        # a caller traced it (its traceparent came in) but its spans never arrived:
        # sent elsewhere, or lost; what lay above (the network, say) is not measured
        rd.flag(s.FLAG_ROOT_MISSING)
    summary = s.RequestSummary(
        trace_id=root.trace_id,
        request_id=request_id or root.span_id,
        # E starts where the user's side (or else the outermost server span) starts
        start_ns=(client or server or root).start_ns,
        e2e_ms=0.0,
        queue_ms=0.0,
        prefill_ms=0.0,
        decode_ms=0.0,
        ttft_ms=rd.time_ms(ttft_ms),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        model=str(model or root.service_name),
        tenant=str(tenant),
        traffic_class=str(traffic),
        service=root.service_name,
        instance=instance,
        instance_id=instance_id,
        environment=str(environment),
        route=str(first((sc.ROUTE,), "")),
        cold_start=cold_start or rd.truth(first((sc.COLD_START,), False)),
        error=error or any(x.status_code == STATUS_ERROR for x in spans),
        gpu_util_mean=rd.number(root.attributes.get(sc.GPU_UTIL_MEAN)),
        gpu_mem_max_bytes=gpu_mem,
        source=source,
        flags=[f for i, f in enumerate(flags) if f not in flags[:i]],
    )
    trace.summarized.append(root)
    drop_impossible_counts(summary)
    part.apply(summary)
    client_times = read_client_times(client, rd) if client is not None else None
    if client_times is not None:
        summary.ttft_client_ms = client_times.first_token_ms
        if (
            summary.ttft_client_ms is not None
            and summary.ttft_ms is not None
            and summary.ttft_client_ms + AGREE_MS < summary.ttft_ms
        ):
            # the user cannot see the first token before the server made it: the client
            # timed something else (a role-only first chunk, a keep-alive) as its first
            # token. Not kept: every user-side wait would read it (the reports fall back
            # to network + the server's TTFT)
            _flag(summary, s.FLAG_SOURCES_DISAGREE)
            summary.ttft_client_ms = None
    for flag in rd.flags:
        _flag(summary, flag)
    times, summary.token_times_source = best_token_times(
        token_offsets_ms, token_times_source, client_times
    )
    if summary.token_times_source == s.TOKEN_TIMES_CLIENT and not token_offsets_ms:
        # the server sent none (vLLM's span): the client's chunks are the request's
        summary.flags = [f for f in summary.flags if f != s.FLAG_NO_TOKEN_TIMES]
    apply_token_times(summary, list(times))
    apply_tpot(summary, decode_measured=decode_measured)
    if len(stream_tokens) > 1:
        apply_streams_tpot(summary, stream_tokens, decode_measured=decode_measured)
    return summary


def apply_streams_tpot(
    summary: s.RequestSummary, stream_tokens: Sequence[int], *, decode_measured: bool
) -> None:
    """Sets the TPOT of an answer made of several streams decoded side by side: the
    decode over the longest stream's tokens, the time per token a reader of each stream
    sees.  Over all the streams' tokens (`output_tokens`, their sum) it would read as
    many times faster than any stream ran as there are streams."""
    longest = max(stream_tokens)
    summary.tpot_ms = summary.decode_ms / (longest - 1) if decode_measured and longest > 1 else None


def below_by_child(trace: TraceView, span: Span) -> list[list[Span]]:
    """Gives the spans below `span`, one list per child of `span` (the child first): what
    each of its branches holds (an SGLang root's threads, a TGI handler's prompts).

    One walk for all the branches, each span once: a loop of parent ids back to `span`
    would make a walk from each child cover every branch again.
    """
    seen = {span.span_id}
    branches: list[list[Span]] = []
    for child in trace.children.get(span.span_id, ()):
        branch: list[Span] = []
        stack = [child]
        while stack:
            x = stack.pop()
            if x.span_id in seen:
                continue
            seen.add(x.span_id)
            branch.append(x)
            stack.extend(trace.children.get(x.span_id, ()))
        if branch:
            branches.append(branch)
    return branches


def _first_attr(spans: Sequence[Span]) -> Callable[[Sequence[str], Any], Any]:
    """Gives `TraceView.first_attr` over `spans`, for many look-ups: the spans' attributes
    (and resources) merged once, the first span's value winning."""
    attrs: dict[str, Any] = {}
    resource: dict[str, Any] = {}
    for x in reversed(spans):
        attrs.update(x.attributes)
        resource.update(x.resource)

    def first(keys: Sequence[str], default: Any) -> Any:
        for key in keys:
            if key in attrs:
                return attrs[key]
            if key in resource:
                return resource[key]
        return default

    return first


def drop_impossible_counts(summary: s.RequestSummary) -> None:
    """A token count a sender got wrong (negative, or beyond 2^31-1) is no count:
    it is dropped and the request flagged, as docs/design.md §2 asks of impossible
    values — and it would not fit the store's column either."""
    for name in ("prompt_tokens", "output_tokens"):
        n = getattr(summary, name)
        if n is not None and not 0 <= n <= s.MAX_TOKEN_COUNT:
            setattr(summary, name, None)
            _flag(summary, s.FLAG_IMPOSSIBLE_COUNT)


def _flag(summary: s.RequestSummary, flag: str) -> None:
    if flag not in summary.flags:
        summary.flags.append(flag)


def made_a_token(spans: Iterable[Span], output_tokens: int | None) -> bool:
    """Gives whether a request without token times produced a first token, so that the
    end of its prefill may stand in for its TTFT: not when it says it produced none, nor
    when it failed (an ERROR status on any of `spans`, its own) without saying how many
    it produced."""
    if output_tokens is not None:
        return output_tokens > 0
    return all(x.status_code != STATUS_ERROR for x in spans)


def inside_any(trace: TraceView, marked: Callable[[Span], bool]) -> Callable[[Span], bool]:
    """Gives a test of whether any of a span's `ancestors` is `marked` (a request nested
    in another is no request of its own).

    Each answer is remembered as `TraceView.fold_ancestors` remembers, so that asking it
    of each span of a trace costs the spans once.  Answers are the plain walk's, loops of
    parent ids included.
    """
    above: dict[str, bool] = {}  # by span id, of the spans `trace.by_id` holds

    def in_loop(loop: list[Span]) -> list[bool]:
        marks = [marked(x) for x in loop]
        n_marked = sum(marks)
        return [n_marked - mark > 0 for mark in marks]  # the loop but itself lies above it

    def inside(span: Span) -> bool:
        return trace.fold_ancestors(
            span, above, lambda parent, found: found or marked(parent), False, in_loop
        )

    return inside


def attr_any(span: Span, keys: Sequence[str]) -> Any:
    for k in keys:
        if k in span.attributes:
            return span.attributes[k]
    return None
