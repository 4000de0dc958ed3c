"""A trace page reads a request's engine steps once, and still picks the request's engine.

Over a lake every table scan costs its catalog work (files, statistics, inlined rows), and the
page read `engine_steps` four times per request: three for the engine rule
(analyzer/queries/request_engines.sql), one for the shared requests.  Now one statement reads
the steps around the request and applies the rule to them; the shared requests are counted
from the same steps.  Here: one `engine_steps` read per request, and the rule's three cases
(own instance, an engine in another process that names the request, neither), each with the
shared requests its engine's steps give.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pytest
from statement_recorder import StatementRecorder

from tokentrace.store.schema import migrate
from tokentrace.web import _trace

T0 = 1_767_225_600 * 10**9
MS = 10**6


def _request(conn: duckdb.DuckDBPyConnection, trace: str, request_id: str, instance: str) -> None:
    """A 100 ms request from T0 on `instance` of service llm."""
    conn.execute(
        "INSERT INTO requests (trace_id, request_id, start_ns, e2e_ms, queue_ms, prefill_ms,"
        " decode_ms, server_ms, queue_wait_ms, tokenize_ms, other_ms, model, tenant, traffic_class,"
        " service, instance, environment, route, cold_start, error, source, flags, kept,"
        " sample_reason, sample_weight) VALUES (?, ?, ?, 100.0, 10, 40, 50, 100, 10, 0, 0, 'm',"
        " '', 'interactive', 'llm', ?, '', '', false, false, 'tokentrace', [], false, '', 1.0)",
        [trace, request_id, T0, instance],
    )


def _steps(conn: duckdb.DuckDBPyConnection, instance: str, ids: list[str], count: int) -> None:
    """`count` 10 ms steps of `instance` from T0 + 5 ms, each serving `ids`."""
    conn.execute(
        "INSERT INTO engine_steps (service, instance, start_ns, duration_us, request_ids) "
        "SELECT 'llm', ?, ? + s * ?, 10000, ? FROM range(?) t(s)",
        [instance, T0 + 5 * MS, 10 * MS, ids, count],
    )


@pytest.fixture
def conn() -> duckdb.DuckDBPyConnection:
    conn = duckdb.connect()
    migrate(conn, "the test's database")
    return conn


def _view(conn: duckdb.DuckDBPyConnection, trace: str) -> tuple[dict[str, Any], list[str]]:
    cur = StatementRecorder(conn.cursor())
    data = _trace.trace_data(cur, trace)  # type: ignore[arg-type]
    [view] = data["requests"]
    return view, [s for s, _ in cur.statements if "engine_steps" in s]


def _shared(view: dict[str, Any]) -> list[tuple[str, int, str | None]]:
    return [(o["request_id"], o["steps"], o["trace_id"]) for o in view["shared_requests"]]


def test_replicas_that_count_the_same_ids_keep_their_own_steps(
    conn: duckdb.DuckDBPyConnection,
) -> None:
    _request(conn, "a" * 32, "req-1", "pod-0")
    _request(conn, "b" * 32, "req-2", "pod-0")
    _steps(conn, "pod-0", ["req-1", "req-2"], 6)
    _steps(conn, "pod-1", ["req-1", "req-9"], 4)  # another replica's own "req-1"

    view, reads = _view(conn, "a" * 32)

    assert len(reads) == 1, reads
    assert view["engine_steps"] == {"overlapping": 6, "served": 6, "truncated": False}
    assert _shared(view) == [("req-2", 6, "b" * 32)]
    assert all("served_with" not in step for step in view["timeline"]["steps"])


def test_an_engine_in_another_process_is_found_by_the_ids_its_steps_name(
    conn: duckdb.DuckDBPyConnection,
) -> None:
    _request(conn, "a" * 32, "req-1", "api-0")  # the API server: its engine core is core-0
    _steps(conn, "core-0", ["req-1", "req-3"], 5)
    _steps(conn, "core-0", ["req-4"], 2)  # the engine's other steps are the request's view too
    _steps(conn, "core-1", ["req-5"], 3)  # another engine, serving others

    view, reads = _view(conn, "a" * 32)

    assert len(reads) == 1, reads
    assert view["engine_steps"] == {"overlapping": 7, "served": 5, "truncated": False}
    assert _shared(view) == [("req-3", 5, None)]  # no summary of req-3: no trace to link


def test_a_request_no_step_names_keeps_its_own_instance(conn: duckdb.DuckDBPyConnection) -> None:
    _request(conn, "a" * 32, "req-1", "api-0")
    _steps(conn, "core-1", ["req-5"], 3)

    view, reads = _view(conn, "a" * 32)

    # no step of its own engine names it: one more read looks for another engine's that do
    # (tests/web/test_security.py's hostile traces: steps of one service name every request)
    assert len(reads) == 2, reads
    assert view["engine_steps"] == {"overlapping": 0, "served": 0, "truncated": False}
    assert view["shared_requests"] == []
