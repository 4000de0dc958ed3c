"""What a query path runs and reads, for tests and benchmarks that count it: a cursor that
records its statements, and the Parquet files each lake table's scans of a statement read."""

from __future__ import annotations

import json
from typing import Any

import duckdb


class StatementRecorder:
    """A cursor that records the statements run through it, with their parameters (the web's
    functions take cursors); everything else is the cursor's."""

    def __init__(self, cur: duckdb.DuckDBPyConnection) -> None:
        self._cur = cur
        self.statements: list[tuple[str, list[Any]]] = []

    def execute(self, sql: str, params: Any = None) -> Any:
        self.statements.append((sql, list(params or [])))
        return self._cur.execute(sql, params or [])

    def cursor(self) -> StatementRecorder:
        """A new cursor of the same database whose statements are recorded here too (a page
        runs its independent statements at once, each on a cursor of its own)."""
        sibling = StatementRecorder(self._cur.cursor())
        sibling.statements = self.statements  # appends from several threads: one list
        return sibling

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


def files_read(conn: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> dict[str, int]:
    """Gives the Parquet files each lake table's scans in `sql` read (EXPLAIN ANALYZE's JSON)."""
    [(_, plan)] = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchall()
    read: dict[str, int] = {}

    def walk(node: dict[str, Any]) -> None:
        info = node.get("extra_info") or {}
        if isinstance(info, dict) and "Total Files Read" in info:
            read[info["Table"]] = read.get(info["Table"], 0) + int(info["Total Files Read"])
        for child in node.get("children", []):
            walk(child)

    walk(json.loads(plan))
    return read
