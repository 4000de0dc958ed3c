"""The overview's data: latency percentiles and bucket shares over time, throughput, findings."""

from __future__ import annotations

import time
from typing import Any

import duckdb

from tokentrace.analyzer.filters import Filters
from tokentrace.web import queries
from tokentrace.web._db import time_limit
from tokentrace.web._params import BUCKETS, MAX_FILTER_TEXT, WINDOWS_NS, ViewFilters
from tokentrace.web._report_cache import ReportCache, ReportsBusy

PERCENTILES = ("p50", "p90", "p95", "p99")
METRICS = ("e2e", "ttft", "tpot", "itl")
#: Bin widths a chart may use, in seconds; the smallest that gives <= MAX_BINS bins wins.
_BIN_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
MAX_BINS = 120
#: Most bins filled in when empty (a window's bins are at most MAX_BINS + 1 unless it spans months).
MAX_EMPTY_FILL = 4 * MAX_BINS
#: How long the overview waits for a report not yet cached before showing the headline.
REPORT_WAIT_S = 0.25


#: How far past the clock a request may start and still anchor the relative windows.
FUTURE_SKEW_NS = 3600 * 10**9


def newest_start_ns(cur: duckdb.DuckDBPyConnection, now_ns: int | None = None) -> int | None:
    """Gives the start of the newest request, where relative windows end (so imported data
    shows too), leaving out requests dated more than FUTURE_SKEW_NS past `now_ns` (the clock):
    the collector takes any start time, and one request dated 2200 must not empty every
    window. When every request is that far ahead, gives the newest of them. One aggregate."""
    ceiling = min((time.time_ns() if now_ns is None else now_ns) + FUTURE_SKEW_NS, 2**63 - 1)
    # two plain max()s, not one max(...) FILTER: each reads row-group statistics (1 ms on
    # 1 M requests), where the FILTER form scans every row (4 ms)
    row = cur.execute(
        "SELECT coalesce((SELECT max(start_ns) FROM requests WHERE start_ns <= ?), "
        "(SELECT max(start_ns) FROM requests))",
        [ceiling],
    ).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def filter_choices(cur: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    """Gives the models, tenants and services seen, for the filter drop-downs."""
    out: dict[str, list[str]] = {"model": [], "tenant": [], "service": []}
    with time_limit(cur):
        for field, value, _ in cur.execute(queries.load("filter_choices")).fetchall():
            # "" (no tenant) is no choice: the empty filter value means "any"; nor is
            # a value longer than a filter takes (the search would refuse it)
            if value and len(value) <= MAX_FILTER_TEXT and len(out[field]) < 200:
                out[field].append(value)
    return out


def bin_seconds(span_ns: int) -> int:
    """Gives the chart's bin width for a window of `span_ns`."""
    for step in _BIN_STEPS_S:
        if span_ns / (step * 10**9) <= MAX_BINS:
            return step
    return _BIN_STEPS_S[-1]


def _pcts(values: list[float] | None) -> dict[str, float | None]:
    if not values:
        return dict.fromkeys(PERCENTILES)
    return {p: (None if v is None else round(float(v), 3)) for p, v in zip(PERCENTILES, values, strict=True)}


def headline(cur: duckdb.DuckDBPyConnection, filters: Filters) -> dict[str, Any]:
    """Gives a report-shaped headline (no ITL, no findings) from one cheap pass over `req`."""
    cte, params = filters.cte()
    with time_limit(cur):
        rel = cur.execute(f"{cte}\n{queries.load('overview_headline')}", params)
        cols = [d[0] for d in rel.description or []]
        r = dict(zip(cols, rel.fetchone() or (), strict=True))
    whole = sum(r[f"{b}_total"] or 0.0 for b in BUCKETS)
    return {
        "window": {"start_ns": r["first_start_ns"], "end_ns": r["last_start_ns"]},
        "requests": {"count": r["requests"], "kept_traces": r["kept"], "errors": r["errors"],
                     "with_client_span": r["with_network"]},
        "latency": {"e2e": _pcts(r["e2e"]), "ttft": _pcts(r["ttft"]), "ttft_client": _pcts(r["ttft_client"]),
                    "tpot": _pcts(r["tpot"]), "itl": dict.fromkeys(PERCENTILES)},
        "buckets": {b: {"share": round((r[f"{b}_total"] or 0.0) / whole, 4) if whole else None} for b in BUCKETS}
        | {"network": {"share": round((r["network_total"] or 0.0) / whole, 4) if whole else None,
                       "measured": bool(r["with_network"])}},
        "findings": [],
    }  # fmt: skip


def _with_empty_bins(rows: list[tuple[Any, ...]], bins: int) -> list[tuple[Any, ...]]:
    """Gives `rows` with a zero-request row for each empty bin of the window.

    A bin without requests is no row of the query; left out, the charts would draw
    a line straight across an idle hour as if requests had kept coming.  A window
    of more than MAX_EMPTY_FILL bins (only explicit ranges of months) stays as it is.
    """
    if bins > MAX_EMPTY_FILL:
        return rows
    have = {int(r[0]): r for r in rows}
    last = max([bins - 1, *have])
    empty = (0, None, None, None, None) + (None,) * len(BUCKETS) + (0,)
    return [have.get(i, (i, *empty)) for i in range(last + 1)]


def overview_data(
    cur: duckdb.DuckDBPyConnection, view: ViewFilters, reports: ReportCache, wait_s: float = REPORT_WAIT_S
) -> dict[str, Any]:
    """Gives everything the overview shows, as plain JSON-ready values.

    The findings come from the report cache: when the report is not ready within
    `wait_s`, the page shows a cheap headline and says the diagnosis is running (also
    when the cache is busy with other diagnoses: `report_busy`, nothing queued for it).
    """
    newest = newest_start_ns(cur)
    filters = view.resolve(newest)
    try:
        cached, refreshing = reports.get(view, wait_s)
        busy = False
    except ReportsBusy:  # other diagnoses fill the queue: the headline now, findings on a reload
        cached, refreshing, busy = None, False, True
    report = cached.report if cached is not None else headline(cur, filters)
    first = filters.start_ns if filters.start_ns is not None else report["window"]["start_ns"]
    last = filters.end_ns if filters.end_ns is not None else report["window"]["end_ns"]
    # `n`: each bin's requests, so a legend's p50 = p99 of a bin of one request says so
    series: dict[str, Any] = {"bin_s": None, "t": [], "n": [], "rps": [], "share": {b: [] for b in BUCKETS}}
    for m in METRICS:
        series[m] = {p: [] for p in PERCENTILES}
    ttft_client_requests = 0
    if first is not None and last is not None and report["requests"]["count"]:
        step = bin_seconds(max(1, int(last) - int(first)))
        bin_ns = step * 10**9
        origin = int(first) - int(first) % bin_ns
        cte, params = filters.cte()
        with time_limit(cur):
            rows = cur.execute(f"{cte}\n{queries.load('overview_series')}", [*params, origin, bin_ns]).fetchall()
        series["bin_s"] = step
        for row in _with_empty_bins(rows, (int(last) - origin) // bin_ns + 1):
            bin_index, count, e2e, ttft, tpot, itl, *totals, with_user_ttft = row
            ttft_client_requests += with_user_ttft
            series["t"].append((origin + bin_index * bin_ns) / 1e9)
            series["n"].append(count)
            series["rps"].append(round(count / step, 4))
            for name, values in zip(METRICS, (e2e, ttft, tpot, itl), strict=True):
                for i, p in enumerate(PERCENTILES):
                    series[name][p].append(None if values is None or values[i] is None else round(values[i], 3))
            whole = sum(t or 0.0 for t in totals)
            for b, total in zip(BUCKETS, totals, strict=True):
                # network without client spans in the bin was not measured: None, not 0 %
                measured = total is not None or b != "network"
                series["share"][b].append(round((total or 0.0) / whole, 4) if whole and measured else None)
    return {
        "filters": view.query(),
        "window": view.window,
        "windows": list(WINDOWS_NS),
        "range": {"start_ns": first, "end_ns": last, "newest_ns": newest},
        "report": report,
        "report_pending": cached is None,
        "report_busy": busy,
        "report_refreshing": refreshing,
        "report_compute_s": None if cached is None else round(cached.compute_s, 3),
        "report_age_s": None if cached is None else round(reports.age_s(cached), 3),
        "services": None if cached is None else cached.services,
        "series": series,
        # the requests whose client span measured the user's TTFT: its card is over these
        "ttft_client_requests": ttft_client_requests,
    }
