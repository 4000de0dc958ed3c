"""One snapshot for a reader's statements: a read transaction around a report.

A report runs some sixty statements.  Outside a transaction each statement is a transaction
of its own, and sees whatever was committed before it: a report over a collector that is
writing mixes what its first and its last statements saw (counts that do not add up).  Over
a lake each of them also reads the catalog's newest snapshot before it reads a byte, ~15 ms
of round trips to PostgreSQL a statement (a statement that reads no rows: 16 ms alone, 0.7
in a transaction), about a second of a report.  Inside one read transaction every statement
sees the data as it was when the first ran, and the lake's snapshot is read once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb


@contextmanager
def one_snapshot(cur: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Runs the block's statements on `cur` in one read transaction, ended with the block.
    `cur` must be in none (a fresh cursor): DuckDB gives no way to ask, and a BEGIN inside a
    transaction aborts that transaction."""
    cur.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        try:
            cur.execute("ROLLBACK")
        except duckdb.Error:
            pass  # an interrupted statement can leave the transaction gone: the error is the block's
        raise
    cur.execute("COMMIT")
