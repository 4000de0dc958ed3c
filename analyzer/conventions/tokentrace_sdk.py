"""Adapter for tokentrace's own SDK spans (names in `instrumentation/semconv.py`)."""

from __future__ import annotations

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.buckets import NS_PER_MS, partition
from tokentrace.analyzer.conventions._common import drop_impossible_counts
from tokentrace.analyzer.itl import apply_token_times, apply_tpot
from tokentrace.analyzer.spans import STATUS_ERROR, Span, list_attr
from tokentrace.analyzer.trace_view import ENV_KEYS, INSTANCE_KEYS, TENANT_KEYS, TraceView
from tokentrace.instrumentation import semconv as sc

NAME = "tokentrace"


def _sum_ns(spans: list[Span], name: str) -> int:
    return sum(x.duration_ns for x in spans if x.name == name)


def _int_or_none(value: object) -> int | None:
    try:
        return None if value is None else int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def summarize(trace: TraceView) -> list[s.RequestSummary]:
    out = []
    for req in trace.spans:
        if req.name == sc.SPAN_REQUEST:
            out.append(_summarize_request(trace, req))
    return out


def _summarize_request(trace: TraceView, req: Span) -> s.RequestSummary:
    phases = list(trace.descendants(req))
    offsets_us = list_attr(req.attributes, sc.TOKEN_OFFSETS_US)
    offsets_ms = [int(o) / 1000.0 for o in offsets_us]
    server_ns = req.duration_ns
    prefill_spans = [p for p in phases if p.name == sc.SPAN_PREFILL]
    prefill_start_ns = min((p.start_ns for p in prefill_spans), default=None)
    flags: list[str] = []

    if offsets_ms:
        first_ns = req.start_ns + int(offsets_ms[0] * NS_PER_MS)
        last_ns = req.start_ns + int(offsets_ms[-1] * NS_PER_MS)
        start_ns = prefill_start_ns if prefill_start_ns is not None else first_ns
        prefill_ns = first_ns - start_ns
        decode_ns = last_ns - first_ns
        ttft_ms: float | None = offsets_ms[0]
    else:
        # No token times: trust the phase spans as measured.
        flags.append(s.FLAG_NO_TOKEN_TIMES)
        prefill_ns = _sum_ns(phases, sc.SPAN_PREFILL)
        decode_ns = _sum_ns(phases, sc.SPAN_DECODE)
        ttft_ms = None
        if prefill_spans:
            ttft_ms = (max(p.end_ns for p in prefill_spans) - req.start_ns) / NS_PER_MS

    client = trace.client_span_of(req)
    part = partition(
        server_ns=server_ns,
        client_ns=client.duration_ns if client is not None else None,
        prefill_ns=prefill_ns,
        decode_ns=decode_ns,
        queue_wait_ns=_sum_ns(phases, sc.SPAN_QUEUE),
        tokenize_ns=_sum_ns(phases, sc.SPAN_TOKENIZE),
    )
    related = [req, *([client] if client is not None else [])]
    out_tokens = _int_or_none(req.attributes.get(sc.OUTPUT_TOKENS))
    if out_tokens is None and offsets_ms:
        out_tokens = len(offsets_ms)
    summary = s.RequestSummary(
        trace_id=req.trace_id,
        request_id=str(req.attributes.get(sc.REQUEST_ID) or req.span_id),
        start_ns=client.start_ns if client is not None else req.start_ns,
        e2e_ms=0.0,
        queue_ms=0.0,
        prefill_ms=0.0,
        decode_ms=0.0,
        ttft_ms=ttft_ms,
        prompt_tokens=_int_or_none(req.attributes.get(sc.PROMPT_TOKENS)),
        output_tokens=out_tokens,
        model=str(
            trace.first_attr((sc.REQUEST_MODEL, sc.RESPONSE_MODEL), related, "") or req.service_name
        ),
        tenant=str(trace.first_attr(TENANT_KEYS, [req, *phases, *related[1:]], "")),
        traffic_class=str(req.attributes.get(sc.TRAFFIC_CLASS) or sc.TRAFFIC_INTERACTIVE),
        service=req.service_name,
        instance=str(trace.first_attr(INSTANCE_KEYS, [req], "")),
        environment=str(trace.first_attr(ENV_KEYS, [req], "")),
        route=str(req.attributes.get(sc.ROUTE, "")),
        cold_start=bool(req.attributes.get(sc.COLD_START, False)),
        error=req.status_code == STATUS_ERROR or any(p.status_code == STATUS_ERROR for p in phases),
        gpu_util_mean=req.attributes.get(sc.GPU_UTIL_MEAN),
        gpu_mem_max_bytes=_int_or_none(req.attributes.get(sc.GPU_MEM_MAX_BYTES)),
        source=NAME,
        flags=flags,
    )
    drop_impossible_counts(summary)
    part.apply(summary)
    if client is not None:
        chunks = list_attr(client.attributes, sc.CLIENT_CHUNK_OFFSETS_US)
        if chunks:
            summary.ttft_client_ms = int(chunks[0]) / 1000.0
        elif sc.CLIENT_TTFC_S in client.attributes:
            summary.ttft_client_ms = float(client.attributes[sc.CLIENT_TTFC_S]) * 1000.0
    apply_token_times(summary, offsets_ms)
    apply_tpot(summary)
    return summary
