"""Fixtures: a real DuckDB file written through the collector's real writer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest

from tokentrace.collector.writer import WriteBatch, Writer
from tokentrace.store.connection import open_db, open_read_only

from .workloads import Workload


@pytest.fixture
def write_workload(tmp_path: Path) -> Iterator[Callable[[Workload], duckdb.DuckDBPyConnection]]:
    """Gives a function that writes a workload to a fresh database and opens it read-only."""
    opened: list[duckdb.DuckDBPyConnection] = []

    def write(w: Workload, name: str = "t.duckdb") -> duckdb.DuckDBPyConnection:
        db = tmp_path / name
        writer = Writer(open_db(db))
        for i in range(0, len(w.requests), 2000):
            assert writer.submit_wait(WriteBatch(requests=w.requests[i:i + 2000]))
        assert writer.submit_wait(WriteBatch(engine_steps=w.engine_steps, gpu_samples=w.gpu_samples))
        writer.close()
        writer._conn.close()
        conn = open_read_only(db)
        opened.append(conn)
        return conn

    yield write
    for c in opened:
        c.close()
