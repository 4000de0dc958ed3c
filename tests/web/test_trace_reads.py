"""A trace page runs its independent reads at once, each on a cursor of its own in one read
transaction (web/_reads.py), and every page begins its own: rows written since the last page
show up on the next, and a read that fails fails the page with the cursors' transactions
ended."""

from __future__ import annotations

import threading
from typing import Any

import duckdb
import pytest
from statement_recorder import StatementRecorder

from tokentrace.store.schema import migrate
from tokentrace.web import _trace
from tokentrace.web._reads import WIDTH

T0 = 1_767_225_600 * 10**9
TRACE = "a" * 32


class ThreadRecorder(StatementRecorder):
    """Records, beside each statement, the thread that ran it.  With `together`, a look-up by
    trace id waits there until that many have begun: they run side by side, or the barrier
    breaks (a pool that ran them one after another on fewer threads, as an idle worker takes
    the next task, would pass a count of threads only when the machine was slow)."""

    def __init__(
        self,
        cur: duckdb.DuckDBPyConnection,
        threads: list[tuple[str, str]],
        together: threading.Barrier | None = None,
    ) -> None:
        super().__init__(cur)
        self.threads = threads
        self.together = together

    def execute(self, sql: str, params: Any = None) -> Any:
        self.threads.append((sql, threading.current_thread().name))
        if self.together is not None and "WHERE trace_id = ?" in sql:
            self.together.wait()
        return super().execute(sql, params)

    def cursor(self) -> ThreadRecorder:
        sibling = ThreadRecorder(self._cur.cursor(), self.threads, self.together)
        sibling.statements = self.statements
        return sibling


def _request(conn: duckdb.DuckDBPyConnection, request_id: str, start_ns: int) -> None:
    conn.execute(
        "INSERT INTO requests (trace_id, request_id, start_ns, e2e_ms, queue_ms, prefill_ms,"
        " decode_ms, server_ms, queue_wait_ms, tokenize_ms, other_ms, model, tenant, traffic_class,"
        " service, instance, environment, route, cold_start, error, source, flags, kept,"
        " sample_reason, sample_weight) VALUES (?, ?, ?, 100.0, 10, 40, 50, 100, 10, 0, 0, 'm',"
        " '', 'interactive', 'llm', 'pod-0', '', '', false, false, 'tokentrace', [], false, '', 1.0)",
        [TRACE, request_id, start_ns],
    )


@pytest.fixture
def conn() -> duckdb.DuckDBPyConnection:
    conn = duckdb.connect()
    migrate(conn, "the test's database")
    _request(conn, "req-1", T0)
    conn.execute(
        "INSERT INTO engine_steps (service, instance, start_ns, duration_us, request_ids) "
        "VALUES ('llm', 'pod-0', ?, 10000, ['req-1'])",
        [T0 + 5 * 10**6],
    )
    return conn


def test_the_look_ups_by_trace_id_run_side_by_side_each_in_a_transaction(
    conn: duckdb.DuckDBPyConnection,
) -> None:
    threads: list[tuple[str, str]] = []
    # requests, spans and kept_traces: each look-up waits for the other two
    cur = ThreadRecorder(conn.cursor(), threads, threading.Barrier(3, timeout=30))

    data = _trace.trace_data(cur, TRACE)  # type: ignore[arg-type]

    assert [r["summary"]["request_id"] for r in data["requests"]] == ["req-1"]
    assert data["requests"][0]["engine_steps"]["served"] == 1
    by_id = {name for sql, name in threads if "WHERE trace_id = ?" in sql}
    assert len(by_id) == 3  # requests, spans and kept_traces: three cursors, three threads
    begun = [name for sql, name in threads if sql == "BEGIN TRANSACTION"]
    ended = [name for sql, name in threads if sql == "COMMIT"]
    assert len(begun) == len(ended) == WIDTH
    main = threading.current_thread().name
    assert all(name != main for sql, name in threads if "FROM" in sql and "system.main" not in sql)


def test_each_page_reads_what_was_written_before_it(conn: duckdb.DuckDBPyConnection) -> None:
    """Not a snapshot kept from an earlier page: a request stored between two pages is on the
    second (in `serve`, the pages' cursors are the writer's connection's)."""
    first = _trace.trace_data(conn.cursor(), TRACE)
    _request(conn, "req-2", T0 + 10**9)
    second = _trace.trace_data(conn.cursor(), TRACE)

    assert [r["summary"]["request_id"] for r in first["requests"]] == ["req-1"]
    assert [r["summary"]["request_id"] for r in second["requests"]] == ["req-1", "req-2"]


def test_a_read_that_fails_fails_the_page_and_ends_every_transaction(
    conn: duckdb.DuckDBPyConnection,
) -> None:
    conn.execute("DROP TABLE gpu_samples")  # the request's GPU samples cannot be read
    cur = StatementRecorder(conn.cursor())

    with pytest.raises(duckdb.CatalogException, match="gpu_samples"):
        _trace.trace_data(cur, TRACE)  # type: ignore[arg-type]

    statements = [sql for sql, _ in cur.statements]
    assert statements.count("BEGIN TRANSACTION") == statements.count("COMMIT") >= 1
    # the database is as it was: its writer's next transaction is not blocked nor refused
    _request(conn, "req-2", T0 + 10**9)
    assert conn.execute("SELECT count(*) FROM requests").fetchone() == (2,)
