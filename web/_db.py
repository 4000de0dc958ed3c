"""Read access for the web pages: one cursor per request, a time limit, a row cap.

Inside `tokentrace serve` the collector owns the process's only DuckDB
connection (DuckDB allows one writer per file), so pages read through cursors
of it; standalone (tests, `create_web_app(settings)`), the file is opened
read-only once and shared the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from tokentrace.store.connection import open_read_only

#: Most rows any page query gives back; more sets `truncated`.
ROW_CAP = 1000
#: Seconds a page query may run before it is interrupted.
QUERY_TIME_LIMIT_S = 10.0


class QueryTimeout(RuntimeError):
    """A page query ran past its time limit and was interrupted."""


class Database:
    """Hands out cursors for page queries, over the collector's or a read-only connection."""

    def __init__(self, db_path: Path, collector: Any = None) -> None:
        self._db_path = db_path
        self._collector = collector
        self._own: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.Lock()

    def _base(self) -> duckdb.DuckDBPyConnection:
        if self._collector is not None:
            conn: duckdb.DuckDBPyConnection = self._collector.conn
            return conn
        with self._lock:
            if self._own is None:
                # opened lazily so the app can start before the first import wrote the file
                self._own = open_read_only(self._db_path)
            return self._own

    @contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """Gives a cursor for one request's queries, closed afterwards."""
        cur = self._base().cursor()
        try:
            yield cur
        finally:
            cur.close()

    def close(self) -> None:
        with self._lock:
            if self._own is not None:
                self._own.close()
                self._own = None


@contextmanager
def time_limit(cur: duckdb.DuckDBPyConnection, seconds: float = QUERY_TIME_LIMIT_S) -> Iterator[None]:
    """Interrupts the cursor's running query after `seconds` (DuckDB has no statement timeout)."""
    fired = threading.Event()

    def _interrupt() -> None:
        fired.set()
        cur.interrupt()

    timer = threading.Timer(seconds, _interrupt)
    timer.daemon = True
    timer.start()
    try:
        yield
    except duckdb.InterruptException as exc:
        if fired.is_set():
            raise QueryTimeout(f"query ran longer than {seconds:g} s; narrow the filters") from exc
        raise
    finally:
        timer.cancel()


def fetch_dicts(
    cur: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] = (), cap: int = ROW_CAP
) -> tuple[list[dict[str, Any]], bool]:
    """Runs `sql` (bound `params`); gives at most `cap` rows as dicts and whether more existed."""
    with time_limit(cur):
        rel = cur.execute(sql, list(params))
        cols = [d[0] for d in rel.description or []]
        rows = rel.fetchmany(cap + 1)
    truncated = len(rows) > cap
    return [dict(zip(cols, r, strict=True)) for r in rows[:cap]], truncated


def table_columns(cur: duckdb.DuckDBPyConnection, table: str) -> dict[str, str]:
    """Gives the real columns of `table` and their types, from the catalog."""
    rows = cur.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? AND schema_name = 'main'",
        [table],
    ).fetchall()
    return {name: dtype for name, dtype in rows}
