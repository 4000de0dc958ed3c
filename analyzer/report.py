"""The report data function: one window of requests in, the DESIGN.md §6 JSON out.

The CLI's text/markdown/json/html renderers and the web explorer all call
`build_report`; nothing renders from anywhere else.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import duckdb

from tokentrace.analyzer import queries
from tokentrace.analyzer.diagnosis import diagnose
from tokentrace.analyzer.filters import Filters
from tokentrace.store.schema import ITL_BUCKET_BOUNDS_MS

PERCENTILES = ("p50", "p90", "p95", "p99")
BUCKETS = ("network", "queue", "prefill", "decode")


def _pcts(values: list[float] | None) -> dict[str, float | None]:
    if not values:
        return dict.fromkeys(PERCENTILES)
    return {name: (None if v is None else round(float(v), 3)) for name, v in zip(PERCENTILES, values, strict=False)}


def run_query(
    conn: duckdb.DuckDBPyConnection, name: str, filters: Filters, extra: list[Any] | None = None
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Runs named query `name` over the filtered `req` CTE; gives columns and rows."""
    cte, params = filters.cte()
    cur = conn.execute(f"{cte}\n{queries.load(name)}", params + (extra or []))
    cols = [d[0] for d in cur.description or []]
    return cols, cur.fetchall()


#: one positional sum per ITL bucket (the schema's fixed bucket count, never input)
_BUCKET_SUMS = ", ".join(
    f"sum(h.counts[{i}])::BIGINT" for i in range(1, len(ITL_BUCKET_BOUNDS_MS) + 2)
)


def itl_bucket_counts(conn: duckdb.DuckDBPyConnection, filters: Filters) -> list[int]:
    """Gives the window's inter-token gap count per ITL histogram bucket."""
    if all(v is None for v in (filters.model, filters.tenant, filters.traffic_class, filters.service)):
        sql = queries.load("itl_histogram_by_time").format(bucket_sums=_BUCKET_SUMS)
        lo, hi = filters.start_ns, filters.end_ns
        row = conn.execute(sql, [lo, lo, hi, hi]).fetchone()
    else:
        cte, params = filters.cte()
        sql = queries.load("itl_histogram").format(bucket_sums=_BUCKET_SUMS)
        row = conn.execute(f"{cte}\n{sql}", params).fetchone()
    return [int(n or 0) for n in (row or ())]


def itl_percentiles(
    conn: duckdb.DuckDBPyConnection, filters: Filters, counts: list[int] | None = None
) -> dict[str, float | None]:
    """ITL percentiles over every inter-token gap of the window (from the histograms)."""
    counts = itl_bucket_counts(conn, filters) if counts is None else counts
    total = sum(counts)
    if not total:
        return dict.fromkeys(PERCENTILES)
    out: dict[str, float | None] = {}
    bounds = ITL_BUCKET_BOUNDS_MS
    for name, q in zip(PERCENTILES, (0.5, 0.9, 0.95, 0.99), strict=False):
        rank = q * total
        seen = 0
        for bucket, n in enumerate(counts):
            seen += n
            if n and seen >= rank:
                # geometric middle of the bucket: ~6 % error at most
                hi = bounds[bucket] if bucket < len(bounds) else bounds[-1] * 1.12
                lo = bounds[bucket - 1] if bucket > 0 else 0.0
                out[name] = round((lo * hi) ** 0.5 if lo else hi, 3)
                break
    return out


def itl_histogram(
    conn: duckdb.DuckDBPyConnection, filters: Filters, counts: list[int] | None = None
) -> list[dict[str, float | None]]:
    """Gives the ITL distribution: per non-empty bucket its upper bound (ms) and gap count."""
    counts = itl_bucket_counts(conn, filters) if counts is None else counts
    bounds = ITL_BUCKET_BOUNDS_MS
    return [
        {"le_ms": bounds[b] if b < len(bounds) else None, "count": n}
        for b, n in enumerate(counts)
        if n
    ]


def timeline(
    conn: duckdb.DuckDBPyConnection, filters: Filters, span_ns: int
) -> dict[str, Any]:
    """Gives e2e / TTFT percentiles per time slice (about 60 slices over the window)."""
    from tokentrace.analyzer.diagnosis._base import NICE_SLICE_SECONDS, TARGET_SLICES

    raw = max(10**9, span_ns // TARGET_SLICES)
    slice_ns = next((s * 10**9 for s in NICE_SLICE_SECONDS if s * 10**9 >= raw), raw)
    _, rows = run_query(conn, "timeline", filters, [slice_ns, slice_ns])
    points = []
    for start, n, e2e, ttft, queue_share in rows:
        points.append(
            {
                "start_ns": int(start),
                "requests": int(n),
                "e2e_p50": round(e2e[0], 3),
                "e2e_p95": round(e2e[1], 3),
                "e2e_p99": round(e2e[2], 3),
                "ttft_p50": None if ttft is None or ttft[0] is None else round(ttft[0], 3),
                "ttft_p95": None if ttft is None or ttft[1] is None else round(ttft[1], 3),
                "queue_share": None if queue_share is None else round(queue_share, 4),
            }
        )
    return {"slice_ns": slice_ns, "points": points}


def build_report(conn: duckdb.DuckDBPyConnection, filters: Filters | None = None) -> dict[str, Any]:
    """Gives the report of the window: requests, latency, buckets, findings."""
    filters = filters or Filters()
    cols, rows = run_query(conn, "latency_percentiles", filters)
    r = dict(zip(cols, rows[0], strict=False))
    e2e_total = r["e2e_total"] or 0.0
    buckets: dict[str, Any] = {}
    for b in BUCKETS:
        total = r[f"{b}_total"] or 0.0
        buckets[b] = {
            **_pcts(r[b]),
            "share": round(total / e2e_total, 4) if e2e_total else None,
        }
    buckets["network"]["measured"] = bool(r["with_network"])
    queue_total = r["queue_total"] or 0.0
    buckets["queue"]["parts"] = {
        part: round((r[f"{part}_total"] or 0.0) / queue_total, 4) if queue_total else None
        for part in ("queue_wait", "tokenize", "other")
    }
    itl_counts = itl_bucket_counts(conn, filters) if r["requests"] else []
    report: dict[str, Any] = {
        "window": {
            "start_ns": r["first_start_ns"],
            "end_ns": r["last_start_ns"],
            "filters": {k: v for k, v in asdict(filters).items() if v is not None},
        },
        "requests": {
            "count": r["requests"],
            "kept_traces": r["kept"],
            "errors": r["errors"],
            "with_client_span": r["with_network"],
            # how many services the requests come from: findings over several mix them
            "services": r["services"],
        },
        "latency": {
            "e2e": _pcts(r["e2e"]),
            "ttft": _pcts(r["ttft"]),
            "ttft_client": _pcts(r["ttft_client"]),
            "tpot": _pcts(r["tpot"]),
            "itl": itl_percentiles(conn, filters, itl_counts),
        },
        "buckets": buckets,
        "findings": diagnose(conn, filters) if r["requests"] else [],
        # chart data (html report, web explorer)
        "timeline": timeline(conn, filters, int((r["last_start_ns"] or 0) - (r["first_start_ns"] or 0)))
        if r["requests"]
        else {"slice_ns": None, "points": []},
        "itl_histogram": itl_histogram(conn, filters, itl_counts),
    }
    return report
