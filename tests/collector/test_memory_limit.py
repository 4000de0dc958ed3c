"""The collector's write connection bounds DuckDB's memory (RSS must not grow with the data
stored), and `serve --duckdb-memory-limit` (or its variable) reaches it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokentrace.collector.collector import Collector
from tokentrace.collector.settings import resolve
from tokentrace.store.connection import MEMORY_LIMIT_ENV, StoreError, open_db


def _limit_mib(conn) -> float:  # type: ignore[no-untyped-def]
    # DuckDB reports the limit in its own units, e.g. '244.1 MiB' for 256MB
    value, unit = conn.execute("SELECT current_setting('memory_limit')").fetchone()[0].split()
    return float(value) * {"KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}[unit]


def test_default_limit_is_modest(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(MEMORY_LIMIT_ENV, raising=False)
    conn = open_db(tmp_path / "a.duckdb")
    try:
        assert 200 < _limit_mib(conn) < 300  # 256MB, not DuckDB's 80 % of RAM
    finally:
        conn.close()


def test_env_then_argument_override(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "1GB")
    conn = open_db(tmp_path / "b.duckdb")
    assert 900 < _limit_mib(conn) < 1000
    conn.close()
    conn = open_db(tmp_path / "b.duckdb", memory_limit="128MB")
    assert 100 < _limit_mib(conn) < 130
    conn.close()


def test_bad_limit_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(StoreError, match="memory_limit 'lots'"):
        open_db(tmp_path / "c.duckdb", memory_limit="lots")


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
