"""A request's token timeline: each token a tick, long gaps marked, engine steps and GPU beside it.

Coordinates are computed here (0..1000 on the x axis of the request's
lifetime) so the template only places SVG shapes; nothing is measured twice:
the stall rule is the analyzer's (`analyzer/itl.py`).
"""

from __future__ import annotations

from typing import Any

from tokentrace.analyzer.itl import STALL_FACTOR, STALL_MIN_MS, quantile
from tokentrace.analyzer.spans import list_attr
from tokentrace.instrumentation import semconv as sc

WIDTH = 1000.0
#: Most engine steps drawn under one timeline; more are summarized, not drawn.
MAX_STEPS_DRAWN = 2000


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


def client_chunk_times_ns(client_span: dict[str, Any] | None) -> list[int]:
    if client_span is None:
        return []
    offsets = list_attr(client_span["attributes"], sc.CLIENT_CHUNK_OFFSETS_US)
    try:
        return [client_span["start_ns"] + int(o) * 1000 for o in offsets]
    except (TypeError, ValueError):
        return []


def build_timeline(
    t0: int,
    t1: int,
    tokens_ns: list[int],
    chunks_ns: list[int],
    steps: list[dict[str, Any]],
    gpu: list[dict[str, Any]],
) -> dict[str, Any]:
    """Gives the drawable timeline of one request between t0 and t1 (unix ns)."""
    t1 = max(t1, *(tokens_ns or [t1]), *(chunks_ns or [t1]))
    gaps_ms = [(b - a) / 1e6 for a, b in zip(tokens_ns, tokens_ns[1:], strict=False)]
    threshold = None
    stalls: list[dict[str, Any]] = []
    if gaps_ms:
        threshold = max(STALL_FACTOR * quantile(sorted(gaps_ms), 0.5), STALL_MIN_MS)
        for i, gap in enumerate(gaps_ms):
            if gap > threshold:
                a, b = tokens_ns[i], tokens_ns[i + 1]
                overlapping = [
                    s
                    for s in steps
                    if s["start_ns"] <= b and s["start_ns"] + s["duration_us"] * 1000 >= a
                ]
                stalls.append(
                    {
                        "after_token": i + 1,
                        "start_ns": a,
                        "gap_ms": round(gap, 3),
                        "x": _x(a, t0, t1),
                        "w": max(1.0, _x(b, t0, t1) - _x(a, t0, t1)),
                        "steps": [
                            {k: s[k] for k in ("start_ns", "duration_us", "batch_size", "prefill_tokens",
                                               "decode_seqs", "queue_depth", "kv_usage", "served")}
                            for s in overlapping[:50]
                        ],
                        "gpu_util_mean": _mean(
                            [g["utilization_pct"] for g in gpu if a <= g["ts_ns"] <= b and g["utilization_pct"] is not None]
                        ),
                    }
                )  # fmt: skip
    drawn = steps[:MAX_STEPS_DRAWN]
    return {
        "t0_ns": t0,
        "t1_ns": t1,
        "duration_ms": round((t1 - t0) / 1e6, 3),
        "tokens": [{"x": _x(t, t0, t1), "ms": round((t - t0) / 1e6, 3)} for t in tokens_ns],
        "chunks": [{"x": _x(t, t0, t1), "ms": round((t - t0) / 1e6, 3)} for t in chunks_ns],
        "stall_threshold_ms": None if threshold is None else round(threshold, 3),
        "stalls": stalls,
        "steps": [
            {
                "x": _x(s["start_ns"], t0, t1),
                "w": max(0.5, round(s["duration_us"] * 1000 / max(1, t1 - t0) * WIDTH, 2)),
                "served": bool(s["served"]),
                "batch_size": s["batch_size"],
                "prefill_tokens": s["prefill_tokens"],
                "start_ms": round((s["start_ns"] - t0) / 1e6, 3),
                "duration_ms": round(s["duration_us"] / 1000, 3),
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
