"""Adapter for tokentrace's own SDK spans (names in `instrumentation/semconv.py`)."""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.buckets import NS_PER_MS, partition
from tokentrace.analyzer.conventions._common import build_summary, made_a_token
from tokentrace.analyzer.conventions._sides import RequestSides, Sides
from tokentrace.analyzer.conventions._values import ValueReader
from tokentrace.analyzer.spans import Span, list_attr
from tokentrace.analyzer.trace_view import TraceView
from tokentrace.instrumentation import semconv as sc

NAME = "tokentrace"


def _sum_ns(spans: list[Span], name: str) -> int:
    return sum(x.duration_ns for x in spans if x.name == name)


class _Compute:
    """A request's compute (its prefill and decode) as merged intervals, to take out of the
    time of its queue and tokenize spans: a request queued again when preempted, or waiting
    between the chunks of a chunked prefill, waits inside a bucket that already holds that
    time, and counted again as queue it would push tokenize and the rest of the queue to 0."""

    def __init__(self, intervals: list[tuple[int, int]]) -> None:
        merged: list[list[int]] = []
        for start, end in sorted(intervals):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            elif end > start:
                merged.append([start, end])
        self._starts = [m[0] for m in merged]
        self._merged = merged
        # compute time before each interval: a span's overlap is two lookups, however many
        # chunks or queue spans a request has (linear in spans, as every adapter is)
        self._before = list(accumulate((m[1] - m[0] for m in merged), initial=0))

    def _until(self, t: int) -> int:
        """Gives the compute time before `t`."""
        i = bisect_right(self._starts, t) - 1
        if i < 0:
            return 0
        start, end = self._merged[i]
        return self._before[i] + min(t, end) - start

    def outside_ns(self, spans: list[Span], name: str) -> int:
        """Gives the time of the `name` spans outside the compute."""
        return sum(
            x.duration_ns - (self._until(x.end_ns) - self._until(x.start_ns))
            for x in spans
            if x.name == name and x.end_ns > x.start_ns
        )


def _summed_ns(rd: ValueReader, req: Span, key: str) -> int:
    """Gives the time of a phase the SDK summarized on the request span (many calls: no
    spans, their summed µs in `key`) as ns; 0 when it did not."""
    us = rd.number(req.attributes.get(key))
    ns = None if us is None else rd.duration(us * 1000)
    return ns or 0


def summarize(trace: TraceView) -> list[s.RequestSummary]:
    requests = [x for x in trace.spans if x.name == sc.SPAN_REQUEST]
    sides = RequestSides(trace, [[x] for x in requests])
    return [_summarize_request(trace, req, sides.of(req)) for req in requests]


def _summarize_request(trace: TraceView, req: Span, sides: Sides) -> s.RequestSummary:
    # a request span inside this one is a request of its own, with its own phases (and a
    # chain of n requests walks n spans, not n^2)
    phases = list(trace.descendants(req, until=sc.SPAN_REQUEST))
    rd = ValueReader()
    offsets_ms = rd.times_ms(list_attr(req.attributes, sc.TOKEN_OFFSETS_US), 1 / 1000)
    out_tokens = rd.count(req.attributes.get(sc.OUTPUT_TOKENS))
    prefill_spans = [p for p in phases if p.name == sc.SPAN_PREFILL]
    prefill_start_ns = min((p.start_ns for p in prefill_spans), default=None)
    flags: list[str] = []

    if offsets_ms:
        first_ns = req.start_ns + round(offsets_ms[0] * NS_PER_MS)
        last_ns = req.start_ns + round(offsets_ms[-1] * NS_PER_MS)
        if prefill_start_ns is not None:
            start_ns = prefill_start_ns
        else:  # no prefill phase: prefill is not measured, and the report must not read it as 0
            start_ns = first_ns
            flags.append(s.FLAG_PREFILL_UNMARKED)
        prefill_ns = first_ns - start_ns
        decode_ns: int | None = last_ns - first_ns
        ttft_ms: float | None = offsets_ms[0]
        compute = _Compute([(start_ns, last_ns)])
    else:
        # No token times: trust the phase spans as measured.
        flags.append(s.FLAG_NO_TOKEN_TIMES)
        decode_spans = [p for p in phases if p.name == sc.SPAN_DECODE]
        # a preempted request's prefill again, inside its decode, is decode time
        prefill_ns = _Compute([(p.start_ns, p.end_ns) for p in decode_spans]).outside_ns(
            phases, sc.SPAN_PREFILL
        )
        decode_ns = _sum_ns(phases, sc.SPAN_DECODE) if decode_spans else None
        ttft_ms = None
        compute = _Compute(
            [(p.start_ns, p.end_ns) for p in phases if p.name in (sc.SPAN_PREFILL, sc.SPAN_DECODE)]
        )
        if prefill_spans and made_a_token([req, *phases], out_tokens):
            # the end of prefill stands in for the first token (a non-streamed answer)
            ttft_ms = (max(p.end_ns for p in prefill_spans) - req.start_ns) / NS_PER_MS

    client = sides.client
    part = partition(
        # the outermost server span (a gateway's, an HTTP server's) where it is the request's
        server_ns=sides.server_ns(req.duration_ns),
        client_ns=client.duration_ns if client is not None else None,
        prefill_ns=prefill_ns,
        decode_ns=decode_ns or 0,
        queue_wait_ns=compute.outside_ns(phases, sc.SPAN_QUEUE),
        tokenize_ns=compute.outside_ns(phases, sc.SPAN_TOKENIZE)
        + _summed_ns(rd, req, sc.TOKENIZE_TOTAL_US),
    )
    if out_tokens is None and offsets_ms:
        out_tokens = len(offsets_ms)
    return build_summary(
        trace,
        req,
        part,
        source=NAME,
        request_id=str(req.attributes.get(sc.REQUEST_ID) or ""),
        related=phases,
        client=client,
        server=sides.server,
        ttft_ms=ttft_ms,
        prompt_tokens=rd.count(req.attributes.get(sc.PROMPT_TOKENS)),
        output_tokens=out_tokens,
        token_offsets_ms=offsets_ms,
        flags=flags,
        reader=rd,
        decode_measured=decode_ns is not None,
    )
