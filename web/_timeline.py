"""A request's token timeline: each token a tick, long gaps marked, engine steps and GPU beside it.

Coordinates are computed here (0..1000 on the x axis of the request's
lifetime) so the template only places SVG shapes; nothing is measured twice:
the stall rule is the analyzer's (`analyzer/itl.py`), and so are the client's chunk
times (`analyzer/conventions/_client_times.py`: the SDK's chunk offsets, OpenLLMetry's
chunk events).  Stalls are read from the times the request's row was: the server's
tokens, or the client's chunks where the row's `token_times_source` is `client`.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from typing import Any

from tokentrace.analyzer.buckets import NS_PER_MS
from tokentrace.analyzer.conventions._client_times import read_client_times
from tokentrace.analyzer.conventions._values import ValueReader
from tokentrace.analyzer.itl import quantile, stall_threshold_ms
from tokentrace.analyzer.spans import Span, SpanEvent, list_attr
from tokentrace.analyzer.summary import TOKEN_TIMES_CLIENT, TOKEN_TIMES_SERVER
from tokentrace.instrumentation import semconv as sc

WIDTH = 1000.0
#: Most engine steps drawn under one timeline; more are summarized, not drawn.
MAX_STEPS_DRAWN = 2000
#: Most token ticks (and, apart, client chunks) drawn: a request span may carry a million
#: token offsets. More are thinned to the first and last time in each of MAX_TIMES_DRAWN / 2
#: equal slices of the axis, which keeps the first and last token and every gap wider than a
#: slice (a stall drawn at all is at least one slice wide) exactly where it is.
MAX_TIMES_DRAWN = 2000
#: Most stalls shaded and listed: the largest ones, in time order.
MAX_STALLS_LISTED = 100
#: Most engine steps listed under one stall.
MAX_STEPS_PER_STALL = 50
_STEP_KEYS = (
    "start_ns",
    "duration_us",
    "batch_size",
    "prefill_tokens",
    "decode_seqs",
    "queue_depth",
    "kv_usage",
    "served",
)


def _x(ns: int, t0: int, t1: int) -> float:
    return round((ns - t0) / max(1, t1 - t0) * WIDTH, 2)


def token_times_ns(request_span: dict[str, Any] | None) -> list[int]:
    """Gives the absolute token times carried by a request span (empty when none)."""
    if request_span is None:
        return []
    offsets = list_attr(request_span["attributes"], sc.TOKEN_OFFSETS_US)
    try:
        return [request_span["start_ns"] + int(o) * 1000 for o in offsets]
    except (TypeError, ValueError):
        return []


def as_span(row: dict[str, Any]) -> Span:
    """Gives a stored span (its JSON columns parsed, `_trace.load_spans`) as the analyzer
    reads one; an event that is not a named time is left out."""
    events = []
    for e in row["events"]:
        try:
            events.append(SpanEvent(str(e["name"]), int(e["time_ns"]), dict(e.get("attributes") or {})))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return Span(
        trace_id=row["trace_id"],
        span_id=row["span_id"],
        parent_span_id=row["parent_span_id"],
        name=row["name"],
        kind=row["kind"],
        start_ns=row["start_ns"],
        end_ns=row["end_ns"],
        attributes=row["attributes"] if isinstance(row["attributes"], dict) else {},
        resource=row["resource"] if isinstance(row["resource"], dict) else {},
        status_code=row["status_code"],
        status_message=row["status_message"],
        events=events,
        scope=row["scope"],
    )


def client_chunk_times_ns(client_span: dict[str, Any] | None) -> list[int]:
    """Gives the chunk arrivals (unix ns) the analyzer reads from a stored client span, in
    order; empty when it has none."""
    if client_span is None:
        return []
    chunks_ms = read_client_times(as_span(client_span), ValueReader()).chunks_ms
    start = client_span["start_ns"]
    return [start + round(ms * NS_PER_MS) for ms in chunks_ms]


def _us_to_ms(us: int | None) -> float | None:
    return None if us is None else round(us / 1000, 3)


def thin_times(
    times_ns: list[int],
    t0: int,
    t1: int,
    most: int = MAX_TIMES_DRAWN,
    keep: frozenset[int] = frozenset(),
) -> list[int]:
    """Gives the indices of `times_ns` to draw, in index order: all of them up to `most`, else
    those in `keep` (the listed stalls' edges) and the earliest and latest time in each of
    `(most - len(keep)) // 2` equal slices of [t0, t1]."""
    if len(times_ns) <= most:
        return list(range(len(times_ns)))
    slices = max(1, (most - len(keep)) // 2)
    span = max(1, t1 - t0)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, t in enumerate(times_ns):
        k = min(slices - 1, max(0, (t - t0) * slices // span))
        j = first.get(k)
        if j is None:
            first[k] = last[k] = i
        elif t < times_ns[j]:
            first[k] = i
        elif t >= times_ns[last[k]]:
            last[k] = i
    return sorted(set(first.values()) | set(last.values()) | keep)


def _marks(
    times_ns: list[int], t0: int, t1: int, keep: frozenset[int] = frozenset()
) -> list[dict[str, Any]]:
    """Gives the ticks to draw for `times_ns`, each with its 1-based number among them all."""
    return [
        {"x": _x(times_ns[i], t0, t1), "ms": round((times_ns[i] - t0) / 1e6, 3), "n": i + 1}
        for i in thin_times(times_ns, t0, t1, keep=keep)
    ]


def _overlapping(
    steps: list[dict[str, Any]], starts: list[int], longest_ns: int, a: int, b: int
) -> list[dict[str, Any]]:
    """Gives the first MAX_STEPS_PER_STALL of `steps` (sorted by start, `starts` their starts)
    that overlap [a, b]: only those starting in [a - longest step, b] can."""
    out = []
    for s in steps[bisect_left(starts, a - longest_ns) : bisect_right(starts, b)]:
        if s["start_ns"] + s["duration_us"] * 1000 >= a:
            out.append({k: s[k] for k in _STEP_KEYS})
            if len(out) == MAX_STEPS_PER_STALL:
                break
    return out


def build_timeline(
    t0: int,
    t1: int,
    tokens_ns: list[int],
    chunks_ns: list[int],
    steps: list[dict[str, Any]],
    gpu: list[dict[str, Any]],
    stalls_from: str = TOKEN_TIMES_SERVER,
) -> dict[str, Any]:
    """Gives the drawable timeline of one request between t0 and t1 (unix ns).

    Bounded however many tokens the request span carries: at most MAX_TIMES_DRAWN token
    ticks and client chunks, and the MAX_STALLS_LISTED largest stalls (counts say how many
    there were); steps overlapping a stall are found by bisecting the steps by start.
    Stalls are the gaps of `tokens_ns`, or of `chunks_ns` where `stalls_from` is `client`.
    """
    t1 = max(t1, max(tokens_ns, default=t1), max(chunks_ns, default=t1))
    times = chunks_ns if stalls_from == TOKEN_TIMES_CLIENT else tokens_ns
    gaps_ms = [(b - a) / 1e6 for a, b in zip(times, times[1:], strict=False)]
    threshold = None
    stalls: list[dict[str, Any]] = []
    stall_count = 0
    if gaps_ms:
        threshold = stall_threshold_ms(quantile(sorted(gaps_ms), 0.5))
        found = [i for i, gap in enumerate(gaps_ms) if gap > threshold]
        stall_count = len(found)
        if stall_count > MAX_STALLS_LISTED:
            # the largest (the earlier of equal ones), listed in time order
            found = sorted(heapq.nlargest(MAX_STALLS_LISTED, found, key=lambda i: gaps_ms[i]))
        by_start = sorted(steps, key=lambda s: s["start_ns"])  # the query's order already
        starts = [s["start_ns"] for s in by_start]
        longest_ns = max((s["duration_us"] * 1000 for s in by_start), default=0)
        samples = sorted(
            (g for g in gpu if g["utilization_pct"] is not None), key=lambda g: g["ts_ns"]
        )
        sample_ts = [g["ts_ns"] for g in samples]
        for i in found:
            a, b = times[i], times[i + 1]
            within = samples[bisect_left(sample_ts, a) : bisect_right(sample_ts, b)]
            stalls.append(
                {
                    "after_token": i + 1,
                    "start_ns": a,
                    "gap_ms": round(gaps_ms[i], 3),
                    "x": _x(a, t0, t1),
                    "w": max(1.0, _x(b, t0, t1) - _x(a, t0, t1)),
                    "steps": _overlapping(by_start, starts, longest_ns, a, b),
                    "gpu_util_mean": _mean([g["utilization_pct"] for g in within]),
                }
            )
    drawn = steps[:MAX_STEPS_DRAWN]
    # the tokens either side of each listed stall stay drawn, whatever the thinning
    edges = frozenset(j for g in stalls for j in (g["after_token"] - 1, g["after_token"]))
    on_chunks = stalls_from == TOKEN_TIMES_CLIENT
    tokens = _marks(tokens_ns, t0, t1, frozenset() if on_chunks else edges)
    chunks = _marks(chunks_ns, t0, t1, edges if on_chunks else frozenset())
    return {
        "t0_ns": t0,
        "t1_ns": t1,
        "duration_ms": round((t1 - t0) / 1e6, 3),
        "tokens": tokens,
        "token_count": len(tokens_ns),
        "tokens_not_drawn": len(tokens_ns) - len(tokens),
        "chunks": chunks,
        "chunk_count": len(chunks_ns),
        "chunks_not_drawn": len(chunks_ns) - len(chunks),
        # what the stalls (and `after_token`) count: the server's tokens or the client's chunks
        "stalls_from": TOKEN_TIMES_CLIENT if on_chunks else TOKEN_TIMES_SERVER,
        "stall_threshold_ms": None if threshold is None else round(threshold, 3),
        "stalls": stalls,
        "stall_count": stall_count,
        "stalls_not_listed": stall_count - len(stalls),
        "steps": [
            {
                "x": _x(s["start_ns"], t0, t1),
                "w": max(0.5, round(s["duration_us"] * 1000 / max(1, t1 - t0) * WIDTH, 2)),
                "served": bool(s["served"]),
                "batch_size": s["batch_size"],
                "prefill_tokens": s["prefill_tokens"],
                "start_ms": round((s["start_ns"] - t0) / 1e6, 3),
                "duration_ms": round(s["duration_us"] / 1000, 3),
                # the timed forward passes: host time vs GPU time (their gap: launch / sync)
                "forward_host_ms": _us_to_ms(s.get("forward_host_us")),
                "gpu_ms": _us_to_ms(s.get("gpu_us")),
            }
            for s in drawn
        ],
        "steps_not_drawn": len(steps) - len(drawn),
        "gpu": [
            {"x": _x(g["ts_ns"], t0, t1), "util": g["utilization_pct"], "gpu": g["gpu_index"]}
            for g in gpu
            if g["utilization_pct"] is not None
        ],
    }


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None
