"""Adapter for SGLang's request traces (0.5; DESIGN.md §3).

The root span is `" Req <rid8>"` (leading space), or `prefill Req …` /
`decode Req …` when prefill and decode are disaggregated.  Under it, one span
per thread (`Tokenizer (…)`, `Scheduler [TP 0] (…)`) holds the slices
`tokenize`, `prefill_waiting`, `prefill_forward`, `decode_waiting`,
`decode_forward`.  SGLang's `time_in_model_prefill` attribute includes the
queue wait, so the queue comes from the `prefill_waiting` slice, and from
`time_in_queue` only when the slices are missing.
"""

from __future__ import annotations

import re

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.buckets import NS_PER_MS, partition
from tokentrace.analyzer.conventions._common import agree, build_summary
from tokentrace.analyzer.conventions._values import ValueReader
from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.trace_view import TraceView

NAME = "sglang"
#: `" Req <rid8>"`, `prefill Req …`, `decode Req …`; spacing as senders vary it, and the
#: rid8 is whatever the user's rid began with (any characters, even none).
ROOT_NAME = re.compile(r"^\s*(?:(?:prefill|decode)\s+)?Req(?:\s+(.*?))?\s*$")
SLICE_TOKENIZE = "tokenize"
SLICE_PREFILL_WAIT = "prefill_waiting"
SLICE_PREFILL = "prefill_forward"
SLICE_DECODE_WAIT = "decode_waiting"
SLICE_DECODE = "decode_forward"
TTFT = "gen_ai.latency.time_to_first_token"
E2E = "gen_ai.latency.e2e"
QUEUE = "gen_ai.latency.time_in_queue"
PREFILL = "gen_ai.latency.time_in_model_prefill"
DECODE = "gen_ai.latency.time_in_model_decode"
PROMPT_TOKENS = ("gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens")
COMPLETION_TOKENS = ("gen_ai.usage.completion_tokens", "gen_ai.usage.output_tokens")
REQUEST_ID = "gen_ai.request.id"


def summarize(trace: TraceView) -> list[s.RequestSummary]:
    roots = [
        x
        for x in trace.spans
        if ROOT_NAME.match(x.name) and not any(ROOT_NAME.match(a.name) for a in trace.ancestors(x))
    ]
    if not roots:
        return []
    # disaggregated prefill/decode roots of one request arrive in one trace: one summary
    by_rid: dict[str, list[Span]] = {}
    for r in roots:
        m = ROOT_NAME.match(r.name)
        rid = m.group(1) if m is not None else None
        by_rid.setdefault(rid or r.span_id, []).append(r)
    return [_summarize(trace, rid, group) for rid, group in by_rid.items()]


def _slice_ns(spans: list[Span], name: str) -> int:
    return sum(x.duration_ns for x in spans if x.name == name)


def _attr(roots: list[Span], key: str | tuple[str, ...]) -> object:
    keys = (key,) if isinstance(key, str) else key
    for k in keys:
        for r in roots:
            if k in r.attributes:
                return r.attributes[k]
    return None


def _summarize(trace: TraceView, rid: str, roots: list[Span]) -> s.RequestSummary:
    roots.sort(key=lambda x: x.start_ns)
    slices = [d for r in roots for d in trace.descendants(r)]
    rd = ValueReader()
    flags: list[str] = []
    if len(roots) == 1:
        server_ns = roots[0].duration_ns
    else:
        # different processes: add the durations, never subtract across clocks
        server_ns = sum(r.duration_ns for r in roots)
    e2e_ns = rd.seconds_ns(_attr(roots, E2E))
    if e2e_ns is not None and len(roots) == 1 and not agree(e2e_ns, server_ns):
        flags.append(s.FLAG_SOURCES_DISAGREE)
    names = {x.name for x in slices}
    if SLICE_PREFILL in names or SLICE_DECODE in names:
        prefill_ns = _slice_ns(slices, SLICE_PREFILL)
        decode_ns = _slice_ns(slices, SLICE_DECODE)
        queue_wait_ns = _slice_ns(slices, SLICE_PREFILL_WAIT) + _slice_ns(slices, SLICE_DECODE_WAIT)
        attr_queue = rd.seconds_ns(_attr(roots, QUEUE))
        if attr_queue is not None and SLICE_PREFILL_WAIT in names and not agree(
            attr_queue, _slice_ns(slices, SLICE_PREFILL_WAIT)
        ):
            flags.append(s.FLAG_SOURCES_DISAGREE)
    else:
        flags.append(s.FLAG_NO_TOKEN_TIMES)
        queue_wait_ns = rd.seconds_ns(_attr(roots, QUEUE)) or 0
        # the prefill attribute includes the queue wait
        prefill_ns = max(0, (rd.seconds_ns(_attr(roots, PREFILL)) or 0) - queue_wait_ns)
        decode_ns = rd.seconds_ns(_attr(roots, DECODE)) or 0
    client = trace.client_span_of(roots[0])
    part = partition(
        server_ns=server_ns,
        client_ns=client.duration_ns if client is not None else None,
        prefill_ns=prefill_ns,
        decode_ns=decode_ns,
        queue_wait_ns=queue_wait_ns,
        tokenize_ns=_slice_ns(slices, SLICE_TOKENIZE),
    )
    ttft_ns = rd.seconds_ns(_attr(roots, TTFT))
    if ttft_ns is None:
        first_prefill = [x for x in slices if x.name == SLICE_PREFILL]
        if first_prefill and len(roots) == 1:
            ttft_ns = max(x.end_ns for x in first_prefill) - roots[0].start_ns
    return build_summary(
        trace,
        roots[0],
        part,
        source=NAME,
        request_id=str(_attr(roots, REQUEST_ID) or rid),
        related=roots[1:],
        client=client,
        ttft_ms=None if ttft_ns is None else ttft_ns / NS_PER_MS,
        prompt_tokens=rd.count(_attr(roots, PROMPT_TOKENS)),
        output_tokens=rd.count(_attr(roots, COMPLETION_TOKENS)),
        flags=flags,
        reader=rd,
    )
