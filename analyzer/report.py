"""The report data function: one window of requests in, the docs/design.md §6 JSON out.

The CLI's text/markdown/json/html renderers and the web explorer all call
`build_report`; nothing renders from anywhere else.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import duckdb

from tokentrace.analyzer import queries
from tokentrace.analyzer.diagnosis import Context, diagnose
from tokentrace.analyzer.diagnosis.coverage import coverage, read_signals
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.itl_window import window_itl_counts
from tokentrace.analyzer.quantiles import LINEAR_FROM, window_quantiles
from tokentrace.store.schema import ITL_BUCKET_BOUNDS_MS

PERCENTILES = ("p50", "p90", "p95", "p99")
QUANTILES = (0.5, 0.9, 0.95, 0.99)
#: each ITL histogram bucket's upper bound over its lower one (~1.12)
ITL_BUCKET_RATIO = ITL_BUCKET_BOUNDS_MS[1] / ITL_BUCKET_BOUNDS_MS[0]
BUCKETS = ("network", "queue", "prefill", "decode")
#: the per-request latencies whose percentiles the report gives: name → column of `req`
LATENCY_COLUMNS = {name: f"{name}_ms" for name in ("e2e", "ttft", "ttft_client", "tpot", *BUCKETS)}


def _pcts(values: list[float] | None) -> dict[str, float | None]:
    if not values:
        return dict.fromkeys(PERCENTILES)
    return {
        name: (None if v is None else round(float(v), 3))
        for name, v in zip(PERCENTILES, values, strict=False)
    }


def run_query(
    conn: duckdb.DuckDBPyConnection, name: str, filters: Filters, extra: list[Any] | None = None
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Runs named query `name` over the filtered `req` CTE; gives columns and rows."""
    cte, params = filters.cte()
    cur = conn.execute(f"{cte}\n{queries.load(name)}", params + (extra or []))
    cols = [d[0] for d in cur.description or []]
    return cols, cur.fetchall()


def _linear_from(conn: duckdb.DuckDBPyConnection, filters: Filters) -> int:
    """Gives the fewest requests a window needs for its percentiles' linear passes: each
    pass reads every request of the window's time range, so a window that picks a few of
    them (a tenant, a model) takes one `quantile_cont` instead, below a third of the range
    (10 M requests, a tenant of 2 M: 1.67 CPU-s in passes against 1.17; 9 M: 3.3 against
    5.1)."""
    picked = (filters.model, filters.tenant, filters.traffic_class, filters.service)
    if all(v is None for v in picked):
        return LINEAR_FROM
    cte, params = Filters(start_ns=filters.start_ns, end_ns=filters.end_ns).cte()
    row = conn.execute(f"{cte}\nSELECT count(*) FROM req", params).fetchone()
    return max(LINEAR_FROM, int(row[0] if row else 0) // 3)


def window_bounds(
    conn: duckdb.DuckDBPyConnection,
    filters: Filters,
    ranged: Sequence[str] = tuple(LATENCY_COLUMNS),
) -> dict[str, Any]:
    """Gives latency_bounds.sql's row (the window's counts and bounds) by name, with each of
    `ranged` (names of `LATENCY_COLUMNS`) counted and ranged in the same statement: its
    `<name>_count`, `_min` and `_max`."""
    extra = "".join(
        f"\n    , count({c}) AS {n}_count, min({c}) AS {n}_min, max({c}) AS {n}_max"
        for n, c in LATENCY_COLUMNS.items()
        if n in ranged
    )
    # the file ends its select list before "FROM req" (one marked place)
    sql = queries.load("latency_bounds").replace("\nFROM req", extra + "\nFROM req", 1)
    cte, params = filters.cte()
    cur = conn.execute(f"{cte}\n{sql}", params)
    cols = [d[0] for d in cur.description or []]
    return dict(zip(cols, cur.fetchone() or (), strict=False))


def latency_ranges(
    bounds: dict[str, Any], ranged: Sequence[str] = tuple(LATENCY_COLUMNS)
) -> list[Any]:
    """Gives each of `ranged`'s count, min and max, in `LATENCY_COLUMNS`' order, from
    `window_bounds`' row: where the percentiles' linear passes start, counted with the
    window's bounds (one scan of a lake's Parquet, not two)."""
    return [
        bounds[f"{name}_{figure}"]
        for name in LATENCY_COLUMNS
        if name in ranged
        for figure in ("count", "min", "max")
    ]


def catalog_bounds(conn: duckdb.DuckDBPyConnection) -> dict[str, tuple[float, float]]:
    """Gives, over a lake, each `requests` column's bounds from the lake's catalog (a range
    that holds every value: store/lake/statistics.py); {} over a file, where DuckDB answers
    the columns' ranges from its own statistics.  The lake's code is imported only here."""
    row = conn.execute(
        "SELECT database_name, type FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchone()
    if not row or row[1] != "ducklake":
        return {}
    from tokentrace.store.lake.statistics import column_bounds

    return column_bounds(conn, row[0], "requests")


def itl_bucket_counts(conn: duckdb.DuckDBPyConnection, filters: Filters) -> list[int]:
    """Gives the window's inter-token gap count per ITL histogram bucket (the per-minute
    rollup where it holds the window's minutes whole: analyzer/itl_window.py)."""
    return window_itl_counts(conn, filters)


@dataclass(frozen=True, slots=True)
class GapFigures:
    """The exact per-request ITL figures of the window (`requests` columns), which bound
    the histogram's estimate: no figure is reported outside the gaps that occurred."""

    #: requests with at least one inter-token gap
    requests: int = 0
    #: the smallest per-request median gap (at least the window's smallest gap)
    p50_min: float | None = None
    #: with one request: its own p95 / p99 (the window's exactly)
    p95_min: float | None = None
    p99_min: float | None = None
    #: the window's largest gap
    gap_max: float | None = None


def _gap_at(rank: int, counts: list[int], cum: list[int], gap_max: float | None) -> float:
    """Gives an estimate of the `rank`-th smallest gap (0-based) from the histogram: its
    bucket, log-interpolated by its rank among the bucket's gaps."""
    bounds = ITL_BUCKET_BOUNDS_MS
    b = bisect.bisect_right(cum, rank)
    lo = bounds[b - 1] if b > 0 else 0.0
    if b < len(bounds):
        hi = bounds[b]
    else:  # the last bucket has no top: it ends at the largest gap where that is known
        hi = gap_max if gap_max is not None else bounds[-1] * ITL_BUCKET_RATIO
    if gap_max is not None:
        # the bucket holding the largest gap ends at it
        hi = max(lo, min(hi, gap_max))
    within = (rank - (cum[b - 1] if b > 0 else 0) + 0.5) / counts[b]
    return lo * (hi / lo) ** within if lo > 0 else hi * within


def itl_percentiles(
    counts: list[int], gaps: GapFigures
) -> tuple[dict[str, float | None], list[str]]:
    """Gives the ITL percentiles over every inter-token gap of the window, and which of
    them are approximate.

    The stored data are per-request histograms (a 12 % log bucket each) and per-request
    figures, not the gaps themselves, so a percentile is interpolated like every other
    percentile (`quantile_cont`) between two order statistics, each estimated within its
    bucket: within one bucket of the exact figure.  It is then held between the smallest
    per-request median gap and the largest gap, so it never falls outside the gaps that
    occurred.  Exact where the figures pin it: one request (its own p50/p95/p99), or every
    request's median gap equal to the largest gap (every percentile from p50 up is that gap).
    """
    total = sum(counts)
    if not total:
        return dict.fromkeys(PERCENTILES), []
    cum = list(itertools.accumulate(counts))
    # one request's own percentiles are the window's (p90 between its p50 and p95)
    own = (
        {"p50": gaps.p50_min, "p95": gaps.p95_min, "p99": gaps.p99_min}
        if gaps.requests == 1
        else {}
    )
    pinned = gaps.p50_min is not None and gaps.p50_min == gaps.gap_max
    out: dict[str, float | None] = {}
    approximate: list[str] = []
    for name, q in zip(PERCENTILES, QUANTILES, strict=True):
        pos = q * (total - 1)
        below = int(pos)
        lower = _gap_at(below, counts, cum, gaps.gap_max)
        upper = _gap_at(min(below + 1, total - 1), counts, cum, gaps.gap_max)
        value = lower + (upper - lower) * (pos - below)
        exact = pinned
        mine = own.get(name)
        if mine is not None:
            value, exact = mine, True
        elif name == "p90" and own.get("p50") is not None and own.get("p95") is not None:
            p50, p95 = float(own["p50"] or 0.0), float(own["p95"] or 0.0)
            value, exact = min(max(value, p50), p95), exact or p50 == p95
        if gaps.p50_min is not None:
            value = max(value, gaps.p50_min)
        if gaps.gap_max is not None:
            value = min(value, gaps.gap_max)
        out[name] = round(value, 3)
        if not exact:
            approximate.append(name)
    return out, approximate


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


def timeline(conn: duckdb.DuckDBPyConnection, filters: Filters, span_ns: int) -> dict[str, Any]:
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
    """Gives the report of the window: requests, latency, buckets, findings, coverage."""
    filters = filters or Filters()
    ctx = Context(conn, filters)
    signals = read_signals(ctx)
    # over a lake, the columns the catalog bounds are not ranged by a scan (a min() of a DOUBLE
    # over Parquet is one): the passes start from the catalog's range, where the window is
    # large enough for passes (a small one ranges them itself, in one cheap scan)
    catalog = catalog_bounds(conn)
    covered = {n: catalog[c] for n, c in LATENCY_COLUMNS.items() if c in catalog}
    ranged = [n for n in LATENCY_COLUMNS if n not in covered]
    r: dict[str, Any] = window_bounds(conn, filters, ranged)
    cols, rows = run_query(conn, "latency_percentiles", filters)
    r |= dict(zip(cols, rows[0], strict=False))
    linear_from = _linear_from(conn, filters)
    ranges: list[Any] | None = latency_ranges(r, ranged)
    if covered and (r["requests"] or 0) < linear_from:
        # a window too small for passes ranges every column itself, the covered ones too
        covered, ranges = {}, None
    r |= window_quantiles(
        conn, ctx.cte, ctx.params, LATENCY_COLUMNS, QUANTILES, linear_from, ranges, covered
    )
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
    itl, itl_approximate = itl_percentiles(
        itl_counts,
        GapFigures(
            int(r["itl_requests"] or 0),
            r["itl_p50_min"],
            r["itl_p95_min"],
            r["itl_p99_min"],
            r["itl_gap_max"],
        ),
    )
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
            # seen only by their client: the wait before the first token reads as prefill
            "server_unseen": r["server_unseen"],
            # how many services the requests come from: findings over several mix them
            "services": r["services"],
        },
        "latency": {
            "e2e": _pcts(r["e2e"]),
            "ttft": _pcts(r["ttft"]),
            "ttft_client": _pcts(r["ttft_client"]),
            "tpot": _pcts(r["tpot"]),
            "itl": itl,
            # the figures estimated rather than computed exactly, per row (only ITL can be)
            "approximate": {"itl": itl_approximate},
        },
        "buckets": buckets,
        "findings": diagnose(ctx, signals) if r["requests"] else [],
        # what the window's traces could show, and what they could not (docs/report.md)
        "coverage": coverage(ctx, signals),
        # chart data (html report, web explorer)
        "timeline": timeline(
            conn, filters, int((r["last_start_ns"] or 0) - (r["first_start_ns"] or 0))
        )
        if r["requests"]
        else {"slice_ns": None, "points": []},
        "itl_histogram": itl_histogram(conn, filters, itl_counts),
    }
    return report
