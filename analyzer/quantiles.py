"""Exact percentiles of a large window in linear passes, not one sort-like aggregate.

DuckDB's `quantile_cont` gathers every value of the window and selects within them: at 10 M
requests that costs about as much per column as the rest of the report's latency section
together, and more than linearly (the values outgrow the CPU's caches).  Here a window of
at least `LINEAR_FROM` values takes three statements that only count and join: each
column's count and range (per group); how many values fall in each of `BINS` equal slices
of that range (per group; `WINDOW_BINS` without groups); and, per group, the few values
wanted of the few slices that hold the wanted ranks, picked by their rank inside their
slice (DuckDB sorts only those slices).  The slice of a value, `round((x - lo) * scale)`,
never decreases as x grows (each step is one correctly rounded IEEE operation, then a
rounding to the nearest integer), so counting slices ranks values exactly, and the answer
is the same order statistics `quantile_cont` interpolates between, interpolated as DuckDB
1.5 does (`lo * (1 - d) + hi * d`): the same figure to the last bit, not an estimate
(tests/analyzer/test_quantiles.py holds it to DuckDB's).

The second and third passes are one statement a column (over the `req` CTE, which is NOT
MATERIALIZED, so each scans its own column only; one UNION ALL of them all can hang DuckDB
1.5: `_Passes.run`), the first one for every column, or none where the caller counted the
ranges with figures of its own (report.py: latency_bounds.sql).  What was measured at 10 M
requests (8 columns, CPU-s): counting a column's slices costs ~0.13 (a hash aggregate on
the integer slice; `floor(..)::BIGINT` clamped by `least()` cost ~0.17, a rounding cast
needs neither); the values of the wanted slices are found by a hash join on the slice
(~0.12 a column) where OR-ed `BETWEEN`s cost ~0.26 and `list_contains` ~0.35; and they are
ranked in DuckDB (`list_sort`, then the wanted positions only): fetching whole slices to
Python moved up to 540,000 rows a column (a long tail leaves most values in the first
slices) and cost more than the scans.  Filtered aggregates (`count(*) FILTER`, `list()
FILTER`) are no way to do several columns in one scan: 64 of them took 11 CPU-s.

Tried at 10 M requests without gain (CPU-s, against ~0.12 + ~0.12 a column here):
- the 8 columns' second passes as one `GROUP BY GROUPING SETS` (one scan, a hash table a
  column): 1.29 against 1.0 as 8 statements; two columns' slices UNNESTed into one
  (column, slice) group: 0.36-0.41 against 0.26; `histogram()` of the slices: 0.53;
- narrowing each percentile from a sample (`TABLESAMPLE 1% (system)`, 0.06) and then, in
  one statement, counting below and listing within each band: 64 `count_if`s alone took
  2.8 (and a system sample's vectors of neighbouring requests made the bands wide);
- counting and listing in one pass, the list filtered to slices a sample foretells (then
  no third pass where it foretold right): `list(x) FILTER (...)` beside `count(*)` cost
  0.33 against 0.13 + 0.13 for the two passes;
- finding the wanted slices' values by a value range pushed into the scan (`BETWEEN`,
  then the exact slice): one range 0.08, the OR of a column's 4-8 ranges 0.26;
- another slice expression: the rounding cast is most of the slice's ~0.06 (`::BIGINT`,
  `::USMALLINT`, `trunc()` the same; `round()` keeps a DOUBLE, whose grouping costs more);
- NumPy: fetching a column (`fetchnumpy`, 0.10-0.16) and `np.partition` at the 8 ranks
  (0.13-0.29: 10 M values outgrow the caches): no less than the two passes; nor counting
  the timeline's slices per time slice with `np.bincount` (fetch 0.32, counting and
  picking 0.49 for its two columns); nor the timeline's lists taken in NumPy (see
  queries/timeline.sql).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import duckdb

#: Below this many values the window's `quantile_cont` is as quick: it is used as it is.
LINEAR_FROM = 200_000
#: Equal slices of a column's range counted in the second pass, per group: the values of a
#: wanted slice are what the third pass ranks (a long tail leaves most values in the first
#: slices: 4096 keep those a small share of the window).
BINS = 4096
#: The same without groups (one window): 4x the slices leave the third pass 4x fewer values
#: to sort (a long tail's first wanted slice held 685,000 of 10 M queue times at 4096) at the
#: same counting cost: 8 columns at 10 M requests, 2.18-2.43 -> 2.07-2.14 CPU-s (8192 and
#: 32768: 2.16, 2.14).  Per group they would not pay: the second pass's hash table grows
#: with groups x slices (61 time slices: 0.31 -> 0.45 CPU-s a column at 16384).
WINDOW_BINS = 16384


def window_quantiles(
    conn: duckdb.DuckDBPyConnection,
    cte: str,
    params: list[Any],
    columns: Mapping[str, str],
    quantiles: Sequence[float],
    linear_from: int = LINEAR_FROM,
    ranges: Sequence[Any] | None = None,
    covering: Mapping[str, tuple[float, float]] | None = None,
) -> dict[str, list[float] | None]:
    """Gives, per name of `columns` (name → SQL expression over the `req` CTE `cte`), its
    `quantile_cont` at each of `quantiles` over the window's non-NULL values; None where it
    has none.  `ranges`, where the caller counted them already (with figures of its own: one
    scan of a lake's Parquet, not two): each column's count, min and max, in order, of the
    columns not in `covering`.  `covering`, per name, a range known to hold every value of
    the column (a lake's catalog bounds: store/lake/statistics.py), for a window the caller
    knows to have at least `linear_from` rows: those columns' passes start from it, with no
    count or range of their own (the figures are the same: `_linear`).  A column whose range
    is empty, or that holds a value its slices cannot count (NaN, an infinity), is ranged and
    passed as without it.  The expressions are the caller's fixed SQL, never input."""
    given = {name: bounds for name, bounds in (covering or {}).items() if name in columns}
    usable = {
        name: (lo, hi)
        for name, (lo, hi) in given.items()
        if lo < hi and math.isfinite(WINDOW_BINS / (hi - lo))
    }
    again = [name for name in given if name not in usable]  # ranged here, as without it
    out: dict[str, list[float] | None] = {}
    if usable:
        names = list(usable)
        passes = _Passes(cte, params, None, [columns[n] for n in names])
        found: dict[Hashable, dict[str, list[float] | None]] = {None: {}}
        linear = {i: usable[n] for i, n in enumerate(names)}
        outside = _linear(conn, passes, {None: None}, names, linear, quantiles, found)
        out |= {n: found[None].get(n) for i, n in enumerate(names) if i not in outside}
        again += [names[i] for i in sorted(outside)]
    if again:
        out |= _window(
            conn, cte, params, {n: columns[n] for n in again}, quantiles, linear_from, None
        )
    rest = {name: e for name, e in columns.items() if name not in given}
    if rest:
        out |= _window(conn, cte, params, rest, quantiles, linear_from, ranges)
    return {name: out.get(name) for name in columns}


def _window(
    conn: duckdb.DuckDBPyConnection,
    cte: str,
    params: list[Any],
    columns: Mapping[str, str],
    quantiles: Sequence[float],
    linear_from: int,
    ranges: Sequence[Any] | None,
) -> dict[str, list[float] | None]:
    rows = None if ranges is None else [(None, *ranges)]
    by_group = grouped_quantiles(
        conn, cte, params, columns, quantiles, linear_from=linear_from, ranges=rows
    )
    return by_group.get(None) or dict.fromkeys(columns)


def grouped_quantiles(
    conn: duckdb.DuckDBPyConnection,
    cte: str,
    params: list[Any],
    columns: Mapping[str, str],
    quantiles: Sequence[float],
    group: str | None = None,
    group_params: Sequence[Any] = (),
    linear_from: int = LINEAR_FROM,
    part_of: Callable[[Any], Hashable] | None = None,
    ranges: Sequence[Sequence[Any]] | None = None,
) -> dict[Hashable, dict[str, list[float] | None]]:
    """Gives, per value of `group` (an SQL expression over `req`, never NULL, with its
    bound `group_params`; None: the whole window, as group None) that has rows, and per
    name of `columns`, its `quantile_cont` at each of `quantiles` over the group's non-NULL
    values (None where it has none): what `SELECT group, quantile_cont(column, quantiles)
    ... GROUP BY group` gives.  With `part_of`, the figures are per part instead, each the
    union of the groups `part_of` maps to it: a cheap group (a time slice) stands for a
    costly one (is the slice among the busiest: a list look-up per request and pass).
    `ranges`, where the caller counted them already: the first pass's rows, per group its
    value, then each column's count, min and max.  The expressions are the caller's fixed
    SQL, never input."""
    names = list(columns)
    passes = _Passes(cte, [*params, *group_params], group, list(columns.values()))
    if ranges is None:
        sql = ", ".join(f"count(x{i}), min(x{i}), max(x{i})" for i in range(len(names)))
        ranges = passes.run(conn, [(passes.select(sql), [])])
    rows = [tuple(row) for row in ranges]
    parts = {row[0]: (row[0] if part_of is None else part_of(row[0])) for row in rows}
    out: dict[Hashable, dict[str, list[float] | None]] = {p: {} for p in parts.values()}
    linear: dict[int, tuple[float, float]] = {}  # column → its range over every group
    small: list[int] = []
    for i, name in enumerate(names):
        # per part: its count and range
        by_part: dict[Hashable, tuple[int, Any, Any]] = {}
        for g, *row in rows:
            n, lo, hi = row[3 * i : 3 * i + 3]
            if n:
                m, low, high = by_part.get(parts[g], (0, lo, hi))
                by_part[parts[g]] = (m + n, min(low, lo), max(high, hi))
        for p in out:
            n, lo, hi = by_part.get(p, (0, None, None))
            if not n:
                out[p][name] = None
            elif lo == hi:  # one value: every percentile is it
                out[p][name] = [float(lo)] * len(quantiles)
        if all(lo == hi for _, lo, hi in by_part.values()):
            continue
        lo, hi = min(lo for _, lo, _ in by_part.values()), max(h for _, _, h in by_part.values())
        total = sum(n for n, _, _ in by_part.values())
        finite = math.isfinite(lo) and math.isfinite(hi) and math.isfinite(passes.bins / (hi - lo))
        if total < linear_from or not finite:
            small.append(i)
        else:
            linear[i] = (float(lo), float(hi))
    if linear:
        _linear(conn, passes, parts, names, linear, quantiles, out)
    if small:
        qs = ", ".join(repr(float(q)) for q in quantiles)
        aggregates = ", ".join(f"quantile_cont(x{i}, [{qs}])" for i in small)
        for p, *values in passes.run(conn, [passes.per_part(aggregates, parts)]):
            for i, v in zip(small, values, strict=True):
                if names[i] not in out[p]:
                    out[p][names[i]] = None if v is None else [float(x) for x in v]
    return out


class _Passes:
    """The statements of one computation: over `v`, the window's rows as the passes read
    them (the group as `g`, each column as `x0`, `x1`, ...), grouped by `g` where the
    caller gave a group (else `g` is NULL and nothing groups by it: a constant group key
    costs a second hash key per row)."""

    def __init__(self, cte: str, params: list[Any], group: str | None, exprs: list[str]) -> None:
        columns = ", ".join(f"{e} AS x{i}" for i, e in enumerate(exprs))
        g = group or "NULL"
        self.head = f"{cte},\nv AS NOT MATERIALIZED (SELECT {g} AS g, {columns} FROM req)"  # noqa: S608 - the caller's fixed SQL
        self.params = params
        self.by = "g" if group else ""
        self.bins = BINS if group else WINDOW_BINS

    def select(self, aggregates: str, where: str = "", key: str = "") -> str:
        """Gives `SELECT g, [key,] aggregates FROM v [WHERE where]` grouped by g and `key`."""
        keys = ", ".join(k for k in (self.by, "k" if key else "") if k)
        return (
            f"SELECT {'g' if self.by else 'NULL'} AS g, {f'{key} AS k, ' if key else ''}{aggregates} "  # noqa: S608 - numbered columns
            f"FROM v {f'WHERE {where} ' if where else ''}{f'GROUP BY {keys}' if keys else ''}"
        )

    def per_part(
        self, aggregates: str, parts: Mapping[Hashable, Hashable]
    ) -> tuple[str, list[Any]]:
        """Gives `SELECT part, aggregates FROM v` grouped by part (each `g`'s in `parts`),
        and its parameters: the window's where there are no groups, else a group's where
        each is its own part."""
        if not self.by:
            return f"SELECT NULL AS part, {aggregates} FROM v", []  # noqa: S608 - numbered columns
        if all(g == p for g, p in parts.items()):
            return self.select(aggregates), []
        sql = (
            f"SELECT m.part, {aggregates} FROM v JOIN "  # noqa: S608 - numbered columns
            "(SELECT unnest(?) AS g, unnest(?) AS part) m ON v.g = m.g GROUP BY m.part"
        )
        return sql, [list(parts), list(parts.values())]

    def run(
        self, conn: duckdb.DuckDBPyConnection, selects: list[tuple[str, list[Any]]]
    ) -> list[tuple[Any, ...]]:
        """Runs each of `selects` (SQL, its parameters) under the head; gives all their rows.

        One statement each, not one UNION ALL: DuckDB 1.5 can hang for good on a UNION ALL
        of three aggregates of 65,536 groups over 10 M rows (2 threads; every thread waits),
        and the UNION cost the same CPU."""
        rows: list[tuple[Any, ...]] = []
        for sql, params in selects:
            rows += conn.execute(f"{self.head}\n{sql}", [*self.params, *params]).fetchall()
        return rows


def _slice(i: int) -> str:
    """Gives the SQL of column `i`'s slice (its range's low end and scale bound after it):
    NULL for a value with none (NaN, an infinity, or one so far outside a covering range that
    its slice overflows), which `_linear` gives back as outside rather than rank wrongly.
    TRY_CAST costs what a plain cast does (0.131 against 0.130 CPU-s a pass at 10 M)."""
    return f"TRY_CAST((x{i} - ?::DOUBLE) * ?::DOUBLE AS BIGINT)"


def _linear(
    conn: duckdb.DuckDBPyConnection,
    passes: _Passes,
    parts: Mapping[Hashable, Hashable],
    names: list[str],
    linear: Mapping[int, tuple[float, float]],
    quantiles: Sequence[float],
    out: dict[Hashable, dict[str, list[float] | None]],
) -> set[int]:
    """Fills `out` with the percentiles of the `linear` columns (index → range) of every
    part (`parts`: group → part) not given yet, by counting slices per group, then ranking
    inside the few wanted slices of each part; a part with no values of a column gets None.
    Any range gives the same figures, the window's own or a wider one that holds it (a lake's
    catalog bounds): a slice only has to grow with the value, and the ranks are counted, not
    assumed.  Gives the columns with a value that has no slice (`_slice`), which it leaves
    alone."""
    scales = {i: passes.bins / (hi - lo) for i, (lo, hi) in linear.items()}
    selects = [
        (passes.select(f"{i} AS col, count(*)", f"x{i} IS NOT NULL", _slice(i)), [lo, scales[i]])
        for i, (lo, _) in linear.items()
    ]
    # per column and part: each slice's count
    counts: dict[tuple[int, Hashable], dict[int, int]] = {}
    outside: set[int] = set()
    for g, s, i, n in passes.run(conn, selects):
        if s is None:
            outside.add(i)
            continue
        by_slice = counts.setdefault((i, parts[g]), {})
        by_slice[s] = by_slice.get(s, 0) + n
    for i in linear:
        for p in out:
            if i not in outside and (i, p) not in counts:
                out[p].setdefault(names[i], None)
    # the order statistics each percentile interpolates between (DuckDB's Interpolator),
    # and where each lies: its slice and its position (1-based) among the slice's values
    ranks: dict[tuple[int, Hashable], list[tuple[int, int, float]]] = {}
    wanted: dict[int, dict[tuple[Hashable, int], set[int]]] = {i: {} for i in linear}
    for (i, p), by_slice in counts.items():
        if names[i] in out[p] or i in outside:
            continue
        slices = sorted(by_slice)
        ends = list(itertools.accumulate(by_slice[s] for s in slices))
        n = ends[-1]
        ranks[i, p] = [_between(n, q) for q in quantiles]
        for below, above, _ in ranks[i, p]:
            for r in {below, above}:
                k = bisect.bisect_right(ends, r)  # the first slice ending past rank r
                first = ends[k] - by_slice[slices[k]]
                wanted[i].setdefault((p, slices[k]), set()).add(r - first + 1)
    members: dict[Hashable, list[Hashable]] = {}
    for g, p in parts.items():
        members.setdefault(p, []).append(g)
    selects = []
    for i, picks in wanted.items():
        if not picks:
            continue
        # the wanted slices of each group of a part, with the positions wanted in them
        w = [(g, p, s, sorted(at)) for (p, s), at in picks.items() for g in members[p]]
        on = f"{_slice(i)} = w.slice" + (" AND v.g = w.g" if passes.by else "")
        sql = (
            f"SELECT {i} AS col, w.part, w.slice, w.at, list_select(list_sort(list(x{i})), w.at) "  # noqa: S608 - numbered columns, bound values
            "FROM v JOIN (SELECT unnest(?) AS g, unnest(?) AS part, unnest(?::BIGINT[]) AS slice, "
            f"unnest(?::INTEGER[][]) AS at) w ON {on} GROUP BY w.part, w.slice, w.at"
        )
        columns: list[Any] = [list(c) for c in zip(*w, strict=True)]
        selects.append((sql, [*columns, linear[i][0], scales[i]]))
    # the value of each wanted rank: column, part, rank → value
    value: dict[tuple[int, Hashable, int], float] = {}
    for i, p, s, at, picked in passes.run(conn, selects):
        first = sum(n for t, n in counts[i, p].items() if t < s)  # the values below slice s
        for position, v in zip(at, picked, strict=True):
            value[i, p, first + position - 1] = float(v)
    for (i, p), wanted_ranks in ranks.items():
        out[p][names[i]] = [
            _interpolate(value[i, p, below], value[i, p, above], below, above, d)
            for below, above, d in wanted_ranks
        ]
    return outside


def _between(n: int, q: float) -> tuple[int, int, float]:
    """Gives the order statistics (0-based ranks) that `quantile_cont` at `q` of `n` values
    interpolates between, and how far past the first it lies (DuckDB's Interpolator)."""
    position = (n - 1) * q
    below = math.floor(position)
    return below, math.ceil(position), position - below


def _interpolate(low: float, high: float, below: int, above: int, d: float) -> float:
    """Gives `quantile_cont`'s figure between order statistics `low` and `high` (ranks
    `below`, `above`; `d` past `low`), computed as DuckDB 1.5 does, to the bit."""
    return low if below == above else low * (1 - d) + high * d
