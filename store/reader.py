"""Read access to a store: one cursor per reader, over a shared connection.

DuckDB allows one writing process per file, so inside `tokentrace serve` the
collector's write connection is the only one and readers (the web pages) take
cursors of it; standalone (`create_web_app(settings)`, tests, benchmarks) the
file is opened read-only once, on the first read, and shared the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from tokentrace.store.connection import open_read_only


class StoreReader:
    """Hands out cursors over `conn` when given, else over the file opened read-only."""

    def __init__(self, db_path: Path, conn: duckdb.DuckDBPyConnection | None = None) -> None:
        self.db_path = db_path
        self._shared = conn
        self._own: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.Lock()

    def _base(self) -> duckdb.DuckDBPyConnection:
        if self._shared is not None:
            return self._shared
        with self._lock:
            if self._own is None:
                # lazily, so a reader can exist before the first import wrote the file
                self._own = open_read_only(self.db_path)
            return self._own

    @contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """Gives a cursor for one reader's queries, closed afterwards."""
        cur = self._base().cursor()
        try:
            yield cur
        finally:
            cur.close()

    def close(self) -> None:
        """Closes the read-only connection this reader opened; a shared one stays its owner's."""
        with self._lock:
            if self._own is not None:
                self._own.close()
                self._own = None
