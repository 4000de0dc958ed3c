"""The search page's rows and total come from one snapshot of the database: under a live
collector a commit between its queries gave "total 3" over an empty page (seen in CI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokentrace.analyzer.summary import RequestSummary
from tokentrace.collector.writer import WriteBatch, Writer
from tokentrace.store.connection import open_db
from tokentrace.web._params import parse_search
from tokentrace.web._search import search_data

T0 = 1_763_000_000_000_000_000


def _request(i: int) -> RequestSummary:
    return RequestSummary(
        trace_id=f"{i:032x}", request_id=f"r{i}", start_ns=T0 + i * 1_000_000_000,
        e2e_ms=100.0, queue_ms=10.0, prefill_ms=40.0, decode_ms=50.0, model="m",
    )  # fmt: skip


class _CommitAfterThePage:
    """A cursor that lets the collector commit new requests right after the page's query."""

    def __init__(self, cur: Any, commit: Any) -> None:
        self._cur, self._commit = cur, commit

    def execute(self, sql: str, params: Any = None) -> Any:
        result = self._cur.execute(sql, params) if params is not None else self._cur.execute(sql)
        if "ORDER BY sort_key" in sql:
            self._commit()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


def test_the_total_counts_the_rows_the_page_saw(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "s.duckdb")
    writer = Writer(conn)
    try:
        assert writer.submit_wait(WriteBatch(requests=[_request(0)]))
        writer.flush()

        def commit() -> None:  # two more requests land between the page and its count
            assert writer.submit_wait(WriteBatch(requests=[_request(1), _request(2)]))
            writer.flush()

        cur = conn.cursor()
        data = search_data(_CommitAfterThePage(cur, commit), parse_search({"window": "all"}))  # type: ignore[arg-type]
        assert data["total"] == len(data["rows"]) == 1
        # the next look sees all three, in one snapshot again
        again = search_data(conn.cursor(), parse_search({"window": "all"}))
        assert again["total"] == len(again["rows"]) == 3
    finally:
        writer.close()
        conn.close()
