"""A page's independent statements, run at once: each on a cursor of its own, in one read
transaction per cursor.

Over a lake every statement pays its catalog work before it reads a byte: round trips to the
catalog's PostgreSQL (the snapshot, the table's files, statistics, inlined rows), mostly
waiting.  A trace page's look-ups by trace id do not depend on each other, nor do a request's
engine steps and GPU samples, so they run side by side; and each cursor's statements share
one transaction, so the lake's snapshot is read once per cursor, not once per statement.
Over a local file the same runs cost a cursor and a transaction each: nothing that shows.

A DuckDB cursor is a connection of its own to the same database (an attached lake is shared),
but `USE` is per connection: each new cursor is pointed at the database the page's cursor
reads (`USE lake` on a query node), inside its transaction, where it costs no extra round trip.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Any, TypeVar

import duckdb

_T = TypeVar("_T")

#: Most statements a page runs at once: the trace page's widest step is its three look-ups by
#: trace id (requests, spans, kept_traces).
WIDTH = 3


def _quoted(name: str) -> str:
    """`name` as a quoted SQL identifier (a database name, from DuckDB's own catalog)."""
    return '"' + name.replace('"', '""') + '"'


class SideBySide:
    """Runs functions of a cursor at once, each on one of up to `width` cursors of its own
    (`submit`); every cursor is in one read transaction, ended when the block ends."""

    def __init__(self, cur: duckdb.DuckDBPyConnection, width: int) -> None:
        self._cur = cur
        # qualified: a bare current_database() is looked up in the lake first (a catalog read)
        [(self._database,)] = cur.execute("SELECT system.main.current_database()").fetchall()
        self._pool = ThreadPoolExecutor(width, thread_name_prefix="tokentrace-page")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._cursors: list[duckdb.DuckDBPyConnection] = []
        self._reads: list[Future[Any]] = []

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        """Gives this worker thread's cursor, made (and pointed at the page's database) once."""
        mine: duckdb.DuckDBPyConnection | None = getattr(self._local, "cursor", None)
        if mine is None:
            mine = self._cur.cursor()
            with self._lock:
                self._cursors.append(mine)
            mine.execute("BEGIN TRANSACTION")
            mine.execute(f"USE {_quoted(str(self._database))}")
            self._local.cursor = mine
        return mine

    def submit(self, read: Callable[..., _T], *args: Any) -> Future[_T]:
        """Starts `read(cursor, *args)` on a cursor of its own; its result (or error) is the
        future's."""
        started = self._pool.submit(lambda: read(self._cursor(), *args))
        self._reads.append(started)
        return started

    def close(self) -> None:
        """Waits for the reads still running, then ends every cursor's transaction, all at once
        (over a lake each end is a round trip to the catalog)."""
        wait(self._reads)  # a page that failed may leave reads running: not two uses of a cursor
        ends = [self._pool.submit(_end, cur) for cur in self._cursors]
        self._pool.shutdown(wait=True)
        for end in ends:
            end.result()


def _end(cur: duckdb.DuckDBPyConnection) -> None:
    """Ends a cursor's read transaction and closes it."""
    try:
        cur.execute("COMMIT")  # a read transaction: nothing to keep, nothing to lose
    except duckdb.Error:
        pass  # interrupted (a time limit) or already rolled back: closing ends it
    cur.close()


@contextmanager
def side_by_side(cur: duckdb.DuckDBPyConnection, width: int = WIDTH) -> Iterator[SideBySide]:
    """Gives a `SideBySide` over `cur` for the block; its cursors are closed after it."""
    reads = SideBySide(cur, width)
    try:
        yield reads
    finally:
        reads.close()
