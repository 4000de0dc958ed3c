"""The report's linear-pass percentiles and peak hours' per-slice SQL read a DuckLake lake
as they read a local file: DuckLake tables (no rowid, no index), the same figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest

from tokentrace.analyzer import queries, report
from tokentrace.analyzer.diagnosis._base import Context, compose
from tokentrace.analyzer.diagnosis.peak_hours import _e2e_percentiles, _sides
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.quantiles import window_quantiles
from tokentrace.analyzer.report import LATENCY_COLUMNS, QUANTILES
from tokentrace.store.connection import open_db
from tokentrace.store.lake.catalog import ALIAS, attach, open_lake

pytestmark = pytest.mark.slow

T0 = 1_750_000_000 * 10**9
#: 20,000 requests over 20 s: a long E2E tail, NULLs, one tenant of three busier later
ROWS = """
INSERT INTO {table} (trace_id, request_id, start_ns, e2e_ms, queue_ms, prefill_ms, decode_ms,
    network_ms, server_ms, queue_wait_ms, tokenize_ms, other_ms, ttft_ms, ttft_client_ms, tpot_ms,
    model, tenant, traffic_class, service, instance, environment, route, cold_start, error,
    source, flags, kept, sample_reason, sample_weight)
SELECT printf('%032x', i), 'r' || i, {t0} + i * 1000000,
    exp((hash(i, 1) % 100000) / 9000.0), (hash(i, 3) % 900) / 3.0, 42.0, (hash(i, 4) % 5000) / 10.0,
    CASE WHEN i % 3 = 0 THEN NULL ELSE (hash(i, 5) % 40)::DOUBLE END, 0, 0, 0, 0,
    CASE WHEN i % 11 = 0 THEN NULL ELSE 1000.0 / (1 + hash(i, 6) % 997) END, NULL,
    18.0 + (hash(i, 7) % 3), 'm', ['a', 'b', 'c'][1 + (i % 3)::INTEGER], 'interactive', 's',
    'p', '', '/', false, false, 'bench', []::VARCHAR[], i % 5 = 0, 'dropped', 1.0
FROM range(20000) t(i)
"""


def _file_and_lake(
    lake: tuple[str, str], tmp_path: Path
) -> tuple[duckdb.DuckDBPyConnection, duckdb.DuckDBPyConnection]:
    """Gives a local file of ROWS' requests and the lake with the same rows, each opened to
    read as the report reads it."""
    db = tmp_path / "local.duckdb"
    writer = open_db(db)
    writer.execute(ROWS.format(table="requests", t0=T0))
    writer.close()
    uri, data = lake
    conn = duckdb.connect()
    attach(conn, uri, data)
    conn.execute(f"ATTACH '{db}' AS local (READ_ONLY)")
    conn.execute(f"INSERT INTO {ALIAS}.requests BY NAME SELECT * FROM local.requests")  # noqa: S608 - the lake's fixed alias
    conn.close()
    return duckdb.connect(str(db), read_only=True), open_lake(uri, data)


def test_the_lake_gives_the_local_files_percentiles_and_peak_figures(
    lake: tuple[str, str], tmp_path: Path
) -> None:
    local, remote = _file_and_lake(lake, tmp_path)
    try:
        for filters in (Filters(), Filters(tenant="b")):
            cte, params = filters.cte()
            figures = [
                window_quantiles(c, cte, params, LATENCY_COLUMNS, QUANTILES, linear_from=0)
                for c in (local, remote)
            ]
            assert figures[0] == figures[1]
            assert figures[0] == window_quantiles(
                local, cte, params, LATENCY_COLUMNS, QUANTILES, linear_from=10**12
            )
        ctx = [Context(c, Filters()) for c in (local, remote)]
        busy = [T0 // ctx[0].slice_ns + k for k in (1, 2, 7)]
        per_slice = [
            sorted(c.query("diag_peak", [c.slice_ns]), key=lambda r: r["slice"]) for c in ctx
        ]
        sides = [_sides(rows, busy) for rows in per_slice]
        # the counts to the unit, the sums to their last digits (summed in another order)
        counts = [{k: v["n"] for k, v in one.items()} for one in sides]
        assert counts[0] == counts[1]
        for side in (True, False):
            for figure in ("queue_share", "e2e_total"):
                assert sides[0][side][figure] == pytest.approx(sides[1][side][figure], rel=1e-12)
        assert _e2e_percentiles(ctx[0], busy, per_slice[0]) == _e2e_percentiles(
            ctx[1], busy, per_slice[1]
        )
        for name, extra in (
            ("affected_peak_hours", [busy, ctx[0].slice_ns]),
            ("affected_window", [0.2]),
            ("diag_peak_tenants", [ctx[0].slice_ns, busy]),
            ("diag_signals", []),
        ):
            rows = [
                sorted(c.execute(compose(x.cte, queries.load(name)), x.params + extra).fetchall())
                for c, x in zip((local, remote), ctx, strict=True)
            ]
            assert rows[0] == rows[1], name
            assert rows[0], name
    finally:
        local.close()
        remote.close()


def test_the_lakes_catalog_bounds_start_the_reports_passes(
    lake: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over a lake the report's latency columns are not ranged by a scan (a min() of a DOUBLE
    over Parquet is one): the catalog's bounds hold every value, start the passes, and the
    report's figures are the local file's."""
    local, remote = _file_and_lake(lake, tmp_path)
    try:
        assert report.catalog_bounds(local) == {}
        bounds = report.catalog_bounds(remote)
        for column in LATENCY_COLUMNS.values():
            lo, hi = local.execute(f"SELECT min({column}), max({column}) FROM requests").fetchone()  # noqa: S608 - fixed names
            if lo is None:  # no value: nothing to bound
                continue
            assert bounds[column][0] <= lo and hi <= bounds[column][1], column
        ranged: list[list[str]] = []
        window_bounds = report.window_bounds

        def noting(conn: duckdb.DuckDBPyConnection, filters: Filters, names: Any = ()) -> Any:
            ranged.append(list(names))
            return window_bounds(conn, filters, names)

        monkeypatch.setattr(report, "window_bounds", noting)
        monkeypatch.setattr(report, "LINEAR_FROM", 0)  # 20,000 requests take the passes
        built = [report.build_report(c) for c in (local, remote)]
        assert ranged[0] == list(LATENCY_COLUMNS)  # the file ranges all (from its statistics)
        assert ranged[1] == ["ttft_client"]  # the lake only the column that has no value
        for part in ("requests", "latency", "window"):
            assert built[0][part] == built[1][part], part
        for bucket in ("network", "queue", "prefill", "decode"):
            assert {k: v for k, v in built[0]["buckets"][bucket].items() if k != "share"} == {
                k: v for k, v in built[1]["buckets"][bucket].items() if k != "share"
            }
    finally:
        local.close()
        remote.close()
