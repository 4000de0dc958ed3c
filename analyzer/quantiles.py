"""Exact percentiles of a large window in linear passes, not one sort-like aggregate.

DuckDB's `quantile_cont` gathers every value of the window and selects within them: at
10 M requests that costs about as much per column as the rest of the report's latency
section together, and more than linearly (the values outgrow the CPU's caches).  Here a
window of at least `LINEAR_FROM` values takes three passes that only count and filter:
the column's count and range; how many values fall in each of `BINS` equal slices of
that range; and the values of the few slices that hold the wanted ranks, ordered here.
The slice of a value, `floor((x - lo) * scale)`, never decreases as x grows (each step is
one correctly rounded IEEE operation), so counting slices ranks values exactly, and the
answer is the same order statistics `quantile_cont` interpolates between, interpolated as
DuckDB 1.5 does (`lo * (1 - d) + hi * d`): the same figure to the last bit, not an estimate
(tests/analyzer/test_quantiles.py holds it to DuckDB's).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb

#: Below this many values the window's `quantile_cont` is as quick: it is used as it is.
LINEAR_FROM = 200_000
#: Equal slices of a column's range counted in the second pass: the values of a slice are
#: what the third pass fetches, so more slices fetch fewer values (a long tail leaves most
#: values in the first slices: 4096 keep those slices a small share of the window).
BINS = 4096


def window_quantiles(
    conn: duckdb.DuckDBPyConnection,
    cte: str,
    params: list[Any],
    columns: Mapping[str, str],
    quantiles: Sequence[float],
    linear_from: int = LINEAR_FROM,
) -> dict[str, list[float] | None]:
    """Gives, per name of `columns` (name → SQL expression over the `req` CTE `cte`), its
    `quantile_cont` at each of `quantiles` over the window's non-NULL values; None where it
    has none.  The expressions are the caller's fixed SQL, never input."""
    names = list(columns)
    ranges = ", ".join(f"count({e}), min({e}), max({e})" for e in columns.values())
    row = conn.execute(f"{cte}\nSELECT {ranges} FROM req", params).fetchone() or ()
    out: dict[str, list[float] | None] = {}
    small: list[str] = []
    for i, name in enumerate(names):
        n, lo, hi = row[3 * i : 3 * i + 3]
        if not n:
            out[name] = None
        elif lo == hi:
            out[name] = [float(lo)] * len(quantiles)
        elif n < linear_from or not (math.isfinite(lo) and math.isfinite(hi)):
            small.append(name)
        else:
            out[name] = _linear(
                conn, cte, params, columns[name], int(n), float(lo), float(hi), quantiles
            )
    if small:
        qs = ", ".join(repr(float(q)) for q in quantiles)
        sql = ", ".join(f"quantile_cont({columns[name]}, [{qs}])" for name in small)
        values = conn.execute(f"{cte}\nSELECT {sql} FROM req", params).fetchone() or ()
        for name, v in zip(small, values, strict=True):
            out[name] = None if v is None else [float(x) for x in v]
    return out


def _linear(
    conn: duckdb.DuckDBPyConnection,
    cte: str,
    params: list[Any],
    expr: str,
    n: int,
    lo: float,
    hi: float,
    quantiles: Sequence[float],
) -> list[float]:
    """Gives `quantile_cont(expr, quantiles)` of `n` values in [lo, hi] by counting slices."""
    scale = BINS / (hi - lo)
    # the top value's slice is BINS itself: least() folds it into the last one
    key = f"least(floor(({expr} - ?::DOUBLE) * ?::DOUBLE)::BIGINT, {BINS - 1})"
    counts = dict(
        conn.execute(
            f"{cte}\nSELECT {key} AS slice, count(*) FROM req WHERE {expr} IS NOT NULL GROUP BY slice",
            [*params, lo, scale],
        ).fetchall()
    )
    slices = sorted(counts)
    ends = list(itertools.accumulate(counts[s] for s in slices))  # ranks below each slice's end
    # the order statistics each percentile interpolates between (DuckDB's Interpolator)
    ranks: dict[float, tuple[int, int, float]] = {}
    for q in quantiles:
        position = (n - 1) * q
        below = math.floor(position)
        ranks[q] = (below, math.ceil(position), position - below)
    wanted = sorted({_slice_of(r, slices, ends) for q in quantiles for r in ranks[q][:2]})
    # each wanted slice's values lie in its stretch of the range, widened by a little for
    # rounding: the scan keeps only those (a cheap comparison) before the slice is computed
    slack = (hi - lo) / BINS / 64
    around = " OR ".join(f"{expr} BETWEEN ? AND ?" for _ in wanted)
    bounds = [b for s in wanted for b in (lo + s / scale - slack, lo + (s + 1) / scale + slack)]
    rows = conn.execute(
        f"{cte}\nSELECT {key} AS slice, {expr} FROM req WHERE ({around}) AND list_contains(?, {key})",
        [*params, lo, scale, *bounds, wanted, lo, scale],
    ).fetchall()
    by_slice: dict[int, list[float]] = {s: [] for s in wanted}
    for s, v in rows:
        by_slice[s].append(v)
    for values in by_slice.values():
        values.sort()

    def at(rank: int) -> float:
        s = _slice_of(rank, slices, ends)
        first = ends[slices.index(s)] - counts[s]
        return float(by_slice[s][rank - first])

    out = []
    for q in quantiles:
        below, above, d = ranks[q]
        low = at(below)
        out.append(low if below == above else low * (1 - d) + at(above) * d)
    return out


def _slice_of(rank: int, slices: list[int], ends: list[int]) -> int:
    """Gives the slice holding the `rank`-th smallest value (0-based)."""
    for s, end in zip(slices, ends, strict=True):
        if rank < end:
            return s
    raise ValueError(f"rank {rank} beyond the window's {ends[-1] if ends else 0} values")
