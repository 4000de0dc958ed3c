"""What every adapter shares: the request's who/what metadata and the summary assembly.

Adapters differ in how they find the buckets; once they have a `Partition`
the rest (model, tenant, traffic class, environment, client side, ITL, TPOT)
is the same for every convention, so it lives here once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.buckets import NS_PER_MS, Partition
from tokentrace.analyzer.itl import apply_token_times, apply_tpot
from tokentrace.analyzer.spans import STATUS_ERROR, Span, list_attr
from tokentrace.analyzer.trace_view import ENV_KEYS, INSTANCE_KEYS, TENANT_KEYS, TraceView
from tokentrace.instrumentation import semconv as sc

#: User-side token-time span events: OpenLLMetry (new and old names).
CHUNK_EVENTS = ("gen_ai.content.completion.chunk", "llm.content.completion.chunk")
#: OpenInference's first-token event.
FIRST_TOKEN_EVENT = "First Token Stream Event"
#: Two measurements of one duration agree when within this much (ms) or this fraction.
AGREE_MS = 5.0
AGREE_FRACTION = 0.05

_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*(ns|µs|μs|us|ms|s|m|h)\s*$")
_UNIT_NS = {"ns": 1, "µs": 1_000, "μs": 1_000, "us": 1_000, "ms": 1_000_000, "s": 10**9,
            "m": 60 * 10**9, "h": 3600 * 10**9}


def to_int(value: object) -> int | None:
    """Gives `value` as an int, None when absent or not a number."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def to_float(value: object) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def seconds_ns(value: object) -> int | None:
    """Gives float seconds (vLLM, SGLang, GenAI attributes) as integer ns."""
    f = to_float(value)
    return None if f is None else round(f * 1e9)


def rust_duration_ns(value: object) -> int | None:
    """Gives a Rust `Duration` Debug string ("3.104512345s", "12.3ms", "123.456µs", "789ns") as ns."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return round(float(value) * 1e9)  # a bare number is seconds
    if not isinstance(value, str):
        return None
    m = _DURATION.match(value)
    if m is None:
        return None
    return round(float(m.group(1)) * _UNIT_NS[m.group(2)])


def agree(a_ns: int, b_ns: int) -> bool:
    """True when two measurements of one duration agree within AGREE_MS / AGREE_FRACTION."""
    diff = abs(a_ns - b_ns) / NS_PER_MS
    return diff <= AGREE_MS or diff <= AGREE_FRACTION * max(abs(a_ns), abs(b_ns)) / NS_PER_MS


def client_token_offsets_ms(client: Span) -> list[float]:
    """Gives the user-side token times (ms from the client span start), from any convention."""
    chunks = list_attr(client.attributes, sc.CLIENT_CHUNK_OFFSETS_US)
    if chunks:
        return [int(c) / 1000.0 for c in chunks]
    times = sorted(e.time_ns for e in client.events if e.name in CHUNK_EVENTS)
    return [(t - client.start_ns) / NS_PER_MS for t in times]


def client_ttft_ms(client: Span) -> float | None:
    """Gives the time to first token as the user saw it, from whichever source the span has."""
    offsets = client_token_offsets_ms(client)
    if offsets:
        return offsets[0]
    for e in client.events:
        if e.name == FIRST_TOKEN_EVENT:
            return (e.time_ns - client.start_ns) / NS_PER_MS
    ttfc = to_float(client.attributes.get(sc.CLIENT_TTFC_S))
    return None if ttfc is None else ttfc * 1000.0


def build_summary(
    trace: TraceView,
    root: Span,
    part: Partition,
    *,
    source: str,
    request_id: str,
    related: Sequence[Span] = (),
    client: Span | None = None,
    ttft_ms: float | None = None,
    prompt_tokens: int | None = None,
    output_tokens: int | None = None,
    token_offsets_ms: Sequence[float] = (),
    flags: Sequence[str] = (),
    cold_start: bool = False,
    extra_model_keys: Sequence[str] = (),
) -> s.RequestSummary:
    """Gives the request summary of `root` (the outermost server-side span) with `part` applied."""
    spans = [root, *related, *([client] if client is not None else [])]
    model = trace.first_attr((sc.REQUEST_MODEL, sc.RESPONSE_MODEL, *extra_model_keys), spans, "")
    tenant = trace.first_attr(TENANT_KEYS, spans, "")
    traffic = trace.first_attr((sc.TRAFFIC_CLASS,), spans, "") or sc.TRAFFIC_INTERACTIVE
    summary = s.RequestSummary(
        trace_id=root.trace_id,
        request_id=request_id or root.span_id,
        start_ns=client.start_ns if client is not None else root.start_ns,
        e2e_ms=0.0,
        queue_ms=0.0,
        prefill_ms=0.0,
        decode_ms=0.0,
        ttft_ms=ttft_ms,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        model=str(model or root.service_name),
        tenant=str(tenant),
        traffic_class=str(traffic),
        service=root.service_name,
        instance=str(trace.first_attr(INSTANCE_KEYS, [root], "")),
        environment=str(trace.first_attr(ENV_KEYS, spans, "")),
        route=str(trace.first_attr((sc.ROUTE,), spans, "")),
        cold_start=cold_start or bool(trace.first_attr((sc.COLD_START,), spans, False)),
        error=any(x.status_code == STATUS_ERROR for x in spans),
        gpu_util_mean=to_float(root.attributes.get(sc.GPU_UTIL_MEAN)),
        gpu_mem_max_bytes=to_int(root.attributes.get(sc.GPU_MEM_MAX_BYTES)),
        source=source,
        flags=[f for i, f in enumerate(flags) if f not in flags[:i]],
    )
    drop_impossible_counts(summary)
    part.apply(summary)
    if client is not None:
        summary.ttft_client_ms = client_ttft_ms(client)
        if (
            summary.ttft_client_ms is not None
            and ttft_ms is not None
            and summary.ttft_client_ms + AGREE_MS < ttft_ms
        ):
            # the user cannot see the first token before the server made it
            _flag(summary, s.FLAG_SOURCES_DISAGREE)
    apply_token_times(summary, list(token_offsets_ms))
    apply_tpot(summary)
    return summary


def drop_impossible_counts(summary: s.RequestSummary) -> None:
    """A token count a sender got wrong (negative, or beyond 2^31-1) is no count:
    it is dropped and the request flagged, as DESIGN.md §2 asks of impossible
    values — and it would not fit the store's column either."""
    for name in ("prompt_tokens", "output_tokens"):
        n = getattr(summary, name)
        if n is not None and not 0 <= n <= s.MAX_TOKEN_COUNT:
            setattr(summary, name, None)
            _flag(summary, s.FLAG_IMPOSSIBLE_COUNT)


def _flag(summary: s.RequestSummary, flag: str) -> None:
    if flag not in summary.flags:
        summary.flags.append(flag)


def attr_any(span: Span, keys: Sequence[str]) -> Any:
    for k in keys:
        if k in span.attributes:
            return span.attributes[k]
    return None
