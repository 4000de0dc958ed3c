"""Page queries' bounds: a time limit and a row cap (with a `truncated` flag).

The cursors come from the store's reader (store/reader.py); these limits are
the explorer's, so a slow filter gives a clear 503 instead of a stuck page.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import duckdb

#: Most rows any page query gives back; more sets `truncated`.
ROW_CAP = 1000
#: Seconds a page query may run before it is interrupted.
QUERY_TIME_LIMIT_S = 10.0


class QueryTimeout(RuntimeError):
    """A page query ran past its time limit and was interrupted."""


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
