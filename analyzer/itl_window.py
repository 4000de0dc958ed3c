"""The window's inter-token gaps per ITL histogram bucket, from the per-minute rollup where it
holds the window's minutes whole, and from the per-request `itl_hist` rows elsewhere.

Summing every request's 119 counts costs ~1.5 s at 10 M requests; the writer sums them per
minute and slice as it writes them (`itl_rollup`, docs/schema.md), a few rows a commit.  A
minute is read from the rollup only where it can answer for it exactly:
- the window holds the whole minute (a window that starts or ends inside a minute reads that
  minute's requests one by one);
- the rollup rows of the window's slice count as many requests in that minute as `requests`
  holds under the window's filters.  Rows written before schema 6 have no rollup, and a minute
  retention has cut in two has lost its rollup rows: both read from `itl_hist`, as a report
  did before the rollup, so the figures never depend on which path answered.
"""

from __future__ import annotations

from typing import Any

import duckdb

from tokentrace.analyzer import queries
from tokentrace.analyzer.diagnosis._base import compose
from tokentrace.analyzer.filters import Filters
from tokentrace.store.schema import ITL_BUCKET_BOUNDS_MS, ROLLUP_NS, ROLLUP_SLICE

#: Stretches of time read one by one, at most, before the minutes the rollup holds are left
#: out by a list instead of by time ranges (rollups missing here and there: unusual).
MAX_RANGES = 32


def bucket_sums(alias: str) -> str:
    """One positional sum per ITL bucket of `alias`.counts (the schema's fixed bucket count)."""
    n = len(ITL_BUCKET_BOUNDS_MS) + 1
    return ", ".join(f"sum({alias}.counts[{i}])::BIGINT" for i in range(1, n + 1))


def _slice(filters: Filters, alias: str) -> tuple[str, list[Any]]:
    """Gives `AND alias.column = ?` for each slice filter set, and its values."""
    set_ = [(c, getattr(filters, c)) for c in ROLLUP_SLICE if getattr(filters, c) is not None]
    return "".join(f" AND {alias}.{c} = ?" for c, _ in set_), [v for _, v in set_]


def _whole(minute_ns: int, filters: Filters) -> bool:
    """Whether the window holds all of the minute starting at `minute_ns`."""
    if filters.start_ns is not None and minute_ns < filters.start_ns:
        return False
    return filters.end_ns is None or minute_ns + ROLLUP_NS <= filters.end_ns


def _ranges(minutes: list[int], filters: Filters) -> list[tuple[int, int]]:
    """Gives the stretches [from, to) of time the `minutes` cover, adjacent ones joined, cut
    to the window."""
    out: list[tuple[int, int]] = []
    for m in sorted(minutes):
        lo = m if filters.start_ns is None else max(m, filters.start_ns)
        hi = m + ROLLUP_NS if filters.end_ns is None else min(m + ROLLUP_NS, filters.end_ns)
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def window_itl_counts(conn: duckdb.DuckDBPyConnection, filters: Filters) -> list[int]:
    """Gives the window's inter-token gap count per ITL histogram bucket."""
    cte, params = filters.cte()
    where, values = _slice(filters, "itl_rollup")
    sql = queries.load("itl_rollup_minutes").format(slice_where=where)
    try:
        minutes = conn.execute(compose(cte, sql), [*params, ROLLUP_NS, *values]).fetchall()
    except duckdb.CatalogException:  # a file of schema 5 or older, read without migrating it
        return _raw_counts(conn, filters, [], None)
    rolled = [m for m, stored, n in minutes if stored == n and _whole(m, filters)]
    counts = [0] * (len(ITL_BUCKET_BOUNDS_MS) + 1)
    if rolled:
        where, values = _slice(filters, "r")
        sql = queries.load("itl_rollup_sum").format(bucket_sums=bucket_sums("r"), slice_where=where)
        row = conn.execute(sql, [rolled, *values]).fetchone() or ()
        counts = [int(n or 0) for n in row]
    held = set(rolled)
    rest = [m for m, _, _ in minutes if m not in held] if rolled else None
    if rest == []:
        return counts
    raw = _raw_counts(conn, filters, rolled, rest)
    return [a + b for a, b in zip(counts, raw, strict=True)]


def _raw_counts(
    conn: duckdb.DuckDBPyConnection, filters: Filters, rolled: list[int], rest: list[int] | None
) -> list[int]:
    """Gives the bucket counts of the window's requests outside the `rolled` minutes, from
    `itl_hist`; `rest`: the window's other minutes (None: every minute of it)."""
    bounds: list[Any] = []
    if rest is None:  # nothing rolled: the whole window, bounded as the filters say
        around = ""
    else:
        ranges = _ranges(rest, filters)
        if len(ranges) <= MAX_RANGES:
            around = (
                " AND (" + " OR ".join("(h.start_ns >= ? AND h.start_ns < ?)" for _ in ranges) + ")"
            )
            bounds = [b for r in ranges for b in r]
        else:
            around = " AND NOT list_contains(?::BIGINT[], h.start_ns - h.start_ns % ?::BIGINT)"
            bounds = [rolled, ROLLUP_NS]
    sums = bucket_sums("h")
    if all(getattr(filters, c) is None for c in ROLLUP_SLICE):
        # a time range (or everything): itl_hist carries start_ns, no join needed
        sql = queries.load("itl_histogram_by_time").format(bucket_sums=sums)
        lo, hi = filters.start_ns, filters.end_ns
        row = conn.execute(sql + around, [lo, lo, hi, hi, *bounds]).fetchone()
    else:
        cte, params = filters.cte()
        sql = queries.load("itl_histogram").format(bucket_sums=sums)
        row = conn.execute(f"{cte}\n{sql}\nWHERE true{around}", [*params, *bounds]).fetchone()
    return [int(n or 0) for n in (row or ())]
