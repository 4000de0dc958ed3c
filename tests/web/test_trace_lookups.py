"""What a trace page reads: the engine steps around its request, not every step before it.

The steps' query bounded `start_ns` from above only (a step overlaps the request when it
starts before the request ends and ends after it starts), so a request in the middle of six
hours of steps read every step before it: 1.1 s on 8.6 M steps (benchmarks/bench_web.py).
Counted here by DuckDB's own profile (rows scanned), never by wall time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
from statement_recorder import StatementRecorder

from tokentrace.store.schema import migrate
from tokentrace.web import _trace

T0 = 1_767_225_600 * 10**9
STEP_NS = 2_500_000
STEPS = 1_000_000  # 41 minutes of steps, 2.5 ms apart
REQUEST = "req-mid"
TRACE = "ab" * 16


def _store(conn: duckdb.DuckDBPyConnection, start_ns: int) -> None:
    """One request at `start_ns` (1 s long) on pod-0, amid STEPS engine steps of pod-0, and
    one long step (3 s) that began 2 s before the request: it overlaps the request."""
    migrate(conn, "the test's database")
    conn.execute(
        "INSERT INTO requests (trace_id, request_id, start_ns, e2e_ms, queue_ms, prefill_ms,"
        " decode_ms, server_ms, queue_wait_ms, tokenize_ms, other_ms, model, tenant, traffic_class,"
        " service, instance, environment, route, cold_start, error, source, flags, kept,"
        " sample_reason, sample_weight) VALUES (?, ?, ?, 1000.0, 10, 90, 900, 1000, 10, 0, 0, 'm',"
        " '', 'interactive', 'llm', 'pod-0', '', '', false, false, 'tokentrace', [], false, '', 1.0)",
        [TRACE, REQUEST, start_ns],
    )
    conn.execute(
        "INSERT INTO engine_steps (service, instance, start_ns, duration_us, request_ids) "
        "SELECT 'llm', 'pod-0', ? + s * ?, 2000, ['req-' || s] FROM range(?) t(s)",
        [T0, STEP_NS, STEPS],
    )
    conn.execute(
        "INSERT INTO engine_steps (service, instance, start_ns, duration_us, request_ids) "
        "VALUES ('llm', 'pod-0', ?, 3000000, [?])",
        [start_ns - 2 * 10**9, REQUEST],
    )


def _rows_scanned(conn: duckdb.DuckDBPyConnection, sql: str, params: list[Any], out: Path) -> int:
    """Gives the rows the table scans of `sql` read, from DuckDB's JSON profile."""
    conn.execute("PRAGMA enable_profiling = 'json'")
    conn.execute("SET profiling_output = ?", [str(out)])
    conn.execute(
        "SET custom_profiling_settings = "
        """'{"OPERATOR_ROWS_SCANNED": "true", "OPERATOR_TYPE": "true"}'"""
    )
    try:
        conn.execute(sql, params).fetchall()
    finally:
        conn.execute("PRAGMA disable_profiling")

    def scanned(node: dict[str, Any]) -> int:
        own = int(node.get("operator_rows_scanned") or 0)
        return own + sum(scanned(child) for child in node.get("children", []))

    return scanned(json.loads(out.read_text()))


def test_the_steps_of_a_request_late_in_a_long_history_are_read_around_it(tmp_path: Path) -> None:
    start_ns = T0 + (STEPS - 2000) * STEP_NS  # near the end: ~1 M steps lie before it
    conn = duckdb.connect(str(tmp_path / "store.duckdb"))
    _store(conn, start_ns)
    cur = StatementRecorder(conn.cursor())

    data = _trace.trace_data(cur, TRACE)  # type: ignore[arg-type]

    [view] = data["requests"]
    # the 3 s step that began before the request, and the 2.5 ms steps inside its second
    assert view["engine_steps"]["served"] == 1
    assert view["engine_steps"]["overlapping"] == 1 + 1000 // 2.5 + 1
    [(sql, params)] = [(s, p) for s, p in cur.statements if "served" in s and "engine_steps" in s]
    scanned = _rows_scanned(conn, sql, params, tmp_path / "profile.json")
    # what a 60 s look-back spans (24,000 steps) in DuckDB's row groups (122,880 rows), not 1 M
    assert scanned < STEPS // 4, f"the steps' query read {scanned:,} rows of {STEPS:,}"


def test_a_step_that_began_before_the_look_back_is_not_looked_for(tmp_path: Path) -> None:
    """The bound is a scheduler step's length: a step 'lasting' longer than STEP_LOOKBACK_NS
    (bad data) is not drawn, which is what keeps the read around the request."""
    start_ns = T0 + 200_000 * STEP_NS
    conn = duckdb.connect(str(tmp_path / "store.duckdb"))
    _store(conn, start_ns)
    conn.execute(
        "INSERT INTO engine_steps (service, instance, start_ns, duration_us, request_ids) "
        "VALUES ('llm', 'pod-0', ?, ?, ['req-ancient'])",
        [start_ns - _trace.STEP_LOOKBACK_NS - 10**9, (_trace.STEP_LOOKBACK_NS + 5 * 10**9) // 1000],
    )

    data = _trace.trace_data(conn.cursor(), TRACE)

    [view] = data["requests"]
    assert view["engine_steps"]["overlapping"] == 1 + 1000 // 2.5 + 1
