"""`serve --duckdb-memory-limit` (or its variable) reaches the write connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokentrace.collector.collector import Collector
from tokentrace.collector.settings import resolve


def _limit(collector: Collector) -> str:
    row = collector.conn.execute("SELECT current_setting('memory_limit')").fetchone()
    assert row is not None
    return str(row[0])


def test_flag_then_env_sets_duckdb_memory_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENTRACE_DUCKDB_MEMORY_LIMIT", "100MB")
    from_env = Collector(resolve({"db": tmp_path / "a.duckdb"}))
    from_flag = Collector(resolve({"db": tmp_path / "b.duckdb", "duckdb_memory_limit": "1GB"}))
    try:
        assert _limit(from_env).startswith("95.3")  # DuckDB shows MiB: 100 MB = 95.3 MiB
        assert _limit(from_flag).startswith("953.6")
    finally:
        from_env.close()
        from_flag.close()
