"""The report's latency percentiles counted in linear passes (analyzer/quantiles.py) are
DuckDB's `quantile_cont` to the last bit: long tails, ties, NULLs, one value, filters."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tokentrace.analyzer import report
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.quantiles import BINS, WINDOW_BINS, grouped_quantiles, window_quantiles
from tokentrace.analyzer.report import LATENCY_COLUMNS, QUANTILES
from tokentrace.store.connection import open_db

T0 = 1_750_000_000 * 10**9

#: requests in the shapes a percentile can trip on: a long tail (most values in the first
#: slices), many ties (network in whole ms), NULLs (no client span, no token), values that
#: differ only past the 12th digit (the slices' rounding), and a column of one value
ROWS = """
INSERT INTO requests (trace_id, request_id, start_ns, e2e_ms, queue_ms, prefill_ms, decode_ms,
    network_ms, server_ms, queue_wait_ms, tokenize_ms, other_ms, ttft_ms, ttft_client_ms, tpot_ms,
    model, tenant, traffic_class, service, instance, environment, route, cold_start, error,
    source, flags, kept, sample_reason, sample_weight)
SELECT printf('%032x', i), 'r' || i, {t0} + i * 1000000,
    exp((hash(i, 1) % 100000) / 9000.0),
    CASE WHEN i % 7 = 0 THEN 1e-9 * (hash(i, 2) % 1000) + 50 ELSE (hash(i, 3) % 900) / 3.0 END,
    42.0,
    (hash(i, 4) % 5000) / 10.0,
    CASE WHEN i % 3 = 0 THEN NULL ELSE (hash(i, 5) % 40)::DOUBLE END,
    0, 0, 0, 0,
    CASE WHEN i % 11 = 0 THEN NULL ELSE 1000.0 / (1 + hash(i, 6) % 997) END,
    NULL,
    CASE WHEN i % 2 = 0 THEN 18.0 + (hash(i, 7) % 3) ELSE 1e6 END,
    'm', ['a', 'b', 'c'][1 + (i % 3)::INTEGER], 'interactive', 's', 'p', '', '/', false, false,
    'bench', []::VARCHAR[], false, 'dropped', 1.0
FROM range({n}) t(i)
"""


#: windows the passes are held to quantile_cont on: all, a tenant, 100 requests, none
WINDOWS = [
    Filters(),
    Filters(tenant="b"),
    Filters(start_ns=T0 + 3_000 * 10**6, end_ns=T0 + 3_100 * 10**6),
    Filters(tenant="nobody"),
]


@pytest.fixture
def conn(tmp_path: Path) -> duckdb.DuckDBPyConnection:
    db = tmp_path / "q.duckdb"
    writer = open_db(db)
    writer.execute(ROWS.format(t0=T0, n=20_000))
    writer.close()
    reader = duckdb.connect(str(db), read_only=True)
    yield reader
    reader.close()


@pytest.mark.parametrize(
    "filters",
    [
        Filters(),
        Filters(tenant="b"),
        Filters(start_ns=T0 + 3_000 * 10**6, end_ns=T0 + 3_100 * 10**6),  # 100 requests
        Filters(start_ns=T0 + 5 * 10**6, end_ns=T0 + 6 * 10**6),  # one request
        Filters(tenant="nobody"),
    ],
)
def test_linear_passes_give_duckdbs_quantile_cont_exactly(
    conn: duckdb.DuckDBPyConnection, filters: Filters
) -> None:
    cte, params = filters.cte()
    linear = window_quantiles(conn, cte, params, LATENCY_COLUMNS, QUANTILES, linear_from=0)
    duck = window_quantiles(conn, cte, params, LATENCY_COLUMNS, QUANTILES, linear_from=10**12)
    assert linear == duck
    # the shapes are there: the tail, the NULLs, the single value, the empty column
    if filters == Filters():
        assert duck["e2e"] is not None and duck["e2e"][3] > 20 * duck["e2e"][0]
        assert duck["prefill"] == [42.0] * 4
        assert duck["ttft_client"] is None


@pytest.mark.parametrize("filters", WINDOWS)
def test_the_reports_bounds_start_the_passes_as_their_own_first_pass_would(
    conn: duckdb.DuckDBPyConnection, filters: Filters
) -> None:
    """build_report hands latency_bounds.sql's counts and ranges to the passes."""
    ranges = report.latency_ranges(report.window_bounds(conn, filters))
    assert len(ranges) == 3 * len(LATENCY_COLUMNS)
    cte, params = filters.cte()
    given = window_quantiles(conn, cte, params, LATENCY_COLUMNS, QUANTILES, 0, ranges)
    assert given == window_quantiles(conn, cte, params, LATENCY_COLUMNS, QUANTILES, 0)
    assert given == window_quantiles(conn, cte, params, LATENCY_COLUMNS, QUANTILES, 10**12)
    if filters == Filters():
        assert given["e2e"] is not None and given["prefill"] == [42.0] * 4


def _true_ranges(conn: duckdb.DuckDBPyConnection) -> dict[str, tuple[float, float]]:
    bounds = report.window_bounds(conn, Filters())
    return {
        n: (bounds[f"{n}_min"], bounds[f"{n}_max"])
        for n in LATENCY_COLUMNS
        if bounds[f"{n}_min"] is not None
    }


#: covering ranges made from a column's own (lo, hi)
STRETCHES: dict[str, Any] = {
    "own": lambda lo, hi: (lo, hi),
    "looser": lambda lo, hi: (lo - 100.0, 3 * hi + 7.0),  # a catalog's looser bounds
    "stale": lambda lo, hi: (lo + (hi - lo) / 3, hi - (hi - lo) / 3),  # values fall outside
    "overflow": lambda lo, hi: (0.0, 1e-12),  # so narrow that far values' slices overflow
}


@pytest.mark.parametrize("stretch", STRETCHES.values(), ids=STRETCHES.keys())
@pytest.mark.parametrize("filters", WINDOWS)
def test_passes_from_a_covering_range_give_the_same_figures(
    conn: duckdb.DuckDBPyConnection, filters: Filters, stretch: Any
) -> None:
    """A lake's catalog bounds (any range, even one some values fall outside) start the
    passes with no range of their own, and the figures are quantile_cont's to the bit."""
    covering = {n: stretch(lo, hi) for n, (lo, hi) in _true_ranges(conn).items()}
    cte, params = filters.cte()
    seen: list[str] = []
    spy = _Recording(conn, seen)
    ranged = [n for n in LATENCY_COLUMNS if n not in covering]  # as build_report ranges them
    ranges = report.latency_ranges(report.window_bounds(conn, filters, ranged), ranged)
    given = window_quantiles(spy, cte, params, LATENCY_COLUMNS, QUANTILES, 0, ranges, covering)  # type: ignore[arg-type]
    assert given == window_quantiles(conn, cte, params, LATENCY_COLUMNS, QUANTILES, 10**12)
    passes = [sql for sql in seen if "v AS NOT MATERIALIZED" in sql]
    ranging = [sql for sql in passes if "min(x" in sql]
    if stretch is STRETCHES["looser"]:  # every range usable and holding every value: no ranging
        assert passes and not ranging
    elif stretch is STRETCHES["overflow"] and given["e2e"] is not None:  # far values: ranged
        assert len(ranging) == 1


def test_a_value_a_slice_cannot_hold_sends_its_column_to_its_own_range(tmp_path: Path) -> None:
    """NaN and infinities have no slice of a covering range (nor of any range): the column
    is ranged and passed as it would be without one (quantile_cont: NaN sorts last)."""
    db = tmp_path / "nan.duckdb"
    writer = open_db(db)
    writer.execute(ROWS.format(t0=T0, n=3_000))
    writer.execute("UPDATE requests SET e2e_ms = 'nan'::DOUBLE WHERE start_ns % 7 = 0")
    writer.execute("UPDATE requests SET queue_ms = 'inf'::DOUBLE WHERE start_ns % 13 = 0")
    writer.close()
    conn = duckdb.connect(str(db), read_only=True)
    try:
        cte, params = Filters().cte()
        covering = {"e2e": (0.0, 100.0), "queue": (0.0, 300.0), "decode": (0.0, 500.0)}
        given = window_quantiles(conn, cte, params, LATENCY_COLUMNS, QUANTILES, 0, None, covering)
        duck = window_quantiles(conn, cte, params, LATENCY_COLUMNS, QUANTILES, 10**12)
        assert repr(given) == repr(duck)  # NaN is not == itself; its repr is
        assert duck["e2e"] is not None and math.isnan(duck["e2e"][3])
        assert duck["queue"] is not None and duck["queue"][3] == math.inf
    finally:
        conn.close()


class _Recording:
    """A connection that notes the SQL of every statement it runs."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, seen: list[str]) -> None:
        self.conn, self.seen = conn, seen

    def execute(self, sql: str, params: Any = None) -> duckdb.DuckDBPyConnection:
        self.seen.append(sql)
        return self.conn.execute(sql, params or [])


@pytest.mark.parametrize(
    ("group", "group_params"),
    [
        ("tenant", []),
        # about 60 groups of ~330 requests, as the report's timeline slices its window
        ("start_ns // ? * ?", [333 * 10**6, 333 * 10**6]),
        ("e2e_ms > ?", [100.0]),  # a BOOLEAN group; queue and network differ between them
    ],
)
def test_grouped_linear_passes_give_duckdbs_grouped_quantile_cont_exactly(
    conn: duckdb.DuckDBPyConnection, group: str, group_params: list[int]
) -> None:
    cte, params = Filters(start_ns=T0 + 10**9).cte()  # 19,000 requests
    qs = (0.5, 0.95, 0.99)
    got = grouped_quantiles(
        conn, cte, params, LATENCY_COLUMNS, qs, group, group_params, linear_from=0
    )
    duck_sql = ", ".join(f"quantile_cont({e}, {list(qs)})" for e in LATENCY_COLUMNS.values())
    rows = conn.execute(
        f"{cte}\nSELECT {group} AS g, {duck_sql} FROM req GROUP BY g", [*params, *group_params]
    ).fetchall()
    duck = {g: dict(zip(LATENCY_COLUMNS, values, strict=True)) for g, *values in rows}
    assert len(duck) > 1
    assert got == duck


@pytest.mark.parametrize("linear_from", [0, 10**12])
def test_parts_of_groups_give_the_quantiles_of_their_unions(
    conn: duckdb.DuckDBPyConnection, linear_from: int
) -> None:
    """Time slices stand for the busiest of them against the rest (peak_hours)."""
    cte, params = Filters().cte()
    slice_ns = 333 * 10**6
    busy = {T0 // slice_ns + k for k in (2, 3, 17, 40)}
    got = grouped_quantiles(
        conn, cte, params, LATENCY_COLUMNS, QUANTILES, "start_ns // ?", [slice_ns],
        linear_from=linear_from, part_of=busy.__contains__,
    )  # fmt: skip
    duck_sql = ", ".join(f"quantile_cont({e}, {list(QUANTILES)})" for e in LATENCY_COLUMNS.values())
    rows = conn.execute(
        f"{cte}\nSELECT list_contains(?, start_ns // ?) AS busy, {duck_sql} FROM req GROUP BY busy",
        [*params, sorted(busy), slice_ns],
    ).fetchall()
    duck = {busy: dict(zip(LATENCY_COLUMNS, values, strict=True)) for busy, *values in rows}
    assert set(duck) == {True, False}
    assert got == duck


@pytest.mark.parametrize(("bins", "group"), [(WINDOW_BINS, None), (BINS, "tenant")])
def test_a_value_at_each_slice_edge_is_ranked_in_order(
    tmp_path: Path, bins: int, group: str | None
) -> None:
    """Values 1/bins of the range apart sit at the slices' edges, where rounding decides: a
    window has `WINDOW_BINS` slices, groups `BINS` each (over the range of them all)."""
    db = tmp_path / "edges.duckdb"
    writer = open_db(db)
    writer.execute(ROWS.format(t0=T0, n=3 * bins))
    # e2e: every edge of the slices, and one value just below and above each, shuffled
    writer.execute(
        "UPDATE requests SET e2e_ms = ((hash(start_ns) % 3)::BIGINT - 1) * 1e-12"
        " + (hash(start_ns, 9) % ?) * 0.1",
        [bins + 1],
    )
    writer.close()
    reader = duckdb.connect(str(db), read_only=True)
    try:
        cte, params = Filters().cte()
        qs = (0.0, 0.001, 0.25, 0.5, 0.77, 0.999, 1.0)
        cols = {"e2e": "e2e_ms"}
        linear = grouped_quantiles(reader, cte, params, cols, qs, group, linear_from=0)
        duck = grouped_quantiles(reader, cte, params, cols, qs, group, linear_from=10**12)
        assert len(linear) == (1 if group is None else 3)
        assert linear == duck
    finally:
        reader.close()


def test_a_window_picking_few_of_its_time_range_skips_the_linear_passes(
    conn: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pass reads the whole time range: a tenant's third of it is not worth 17 passes."""
    monkeypatch.setattr(report, "LINEAR_FROM", 0)
    assert report._linear_from(conn, Filters()) == 0
    assert report._linear_from(conn, Filters(start_ns=T0 + 10**10)) == 0
    assert report._linear_from(conn, Filters(tenant="b")) == 20_000 // 3
    assert report._linear_from(conn, Filters(tenant="b", start_ns=T0 + 10**10)) == 10_000 // 3
