"""The search page's data: filtered requests, keyset-paged on any sortable column.

Paging is by keyset — `(sort key, trace_id, hash(request_id))` strictly after
the last row shown — so page 1000 costs what page 1 costs on a million requests.
The cursor carries no value as a sender wrote it: a request id may be 100,000
characters, so it is tied on by its hash (a UBIGINT), and a text column sorts on
its first SORT_PREFIX_CHARS characters.  DuckDB's `hash` rather than `md5`: md5
of every request id costs ~70 ms a page on a million requests, `hash` ~7 ms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import duckdb

from tokentrace.analyzer.diagnosis import COMPLAINTS, TITLES
from tokentrace.analyzer.diagnosis._base import MAX_AFFECTED
from tokentrace.web._db import fetch_dicts, table_columns, time_limit
from tokentrace.web._overview import newest_start_ns
from tokentrace.web._params import SORT_PREFIX_CHARS, SORTABLE, ParamError, SearchParams

#: Columns each result row shows (read by name: missing ones are left out).
RESULT_COLUMNS = (
    "trace_id", "request_id", "start_ns", "e2e_ms", "ttft_ms", "tpot_ms", "network_ms", "queue_ms",
    "prefill_ms", "decode_ms", "itl_p99_ms", "itl_max_ms", "stall_count", "prompt_tokens",
    "output_tokens", "model", "tenant", "traffic_class", "service", "kept", "sample_reason", "error",
    "cold_start",
)  # fmt: skip

#: The bucket that took the most of a request's time (network counts 0 when not measured).
DOMINANT_BUCKET_SQL = (
    "CASE WHEN coalesce(network_ms, 0) >= greatest(queue_ms, prefill_ms, decode_ms) THEN 'network' "
    "WHEN queue_ms >= greatest(prefill_ms, decode_ms) THEN 'queue' "
    "WHEN prefill_ms >= decode_ms THEN 'prefill' ELSE 'decode' END"
)


def complaint_trace_ids(report: dict[str, Any], complaint: str) -> list[str] | None:
    """Gives the trace ids the current finding `complaint` of `report` names, None when there is no such finding."""
    finding = _finding(report, complaint)
    if finding is None:
        return None
    ids = finding.get("affected_trace_ids") or finding.get("example_traces") or []
    return [str(i) for i in ids]


def _finding(report: dict[str, Any], complaint: str) -> dict[str, Any] | None:
    for finding in report.get("findings", []):
        if finding.get("complaint") == complaint:
            return dict(finding)
    return None


def affected_note(finding: dict[str, Any] | None, listed: int) -> str | None:
    """Gives the note saying a finding's requests are more than its `listed` trace ids (the
    analyzer keeps the first MAX_AFFECTED, `affected_count` says how many there are); None
    when it does not say or they are all listed."""
    count = (finding or {}).get("affected_count")
    if not isinstance(count, int) or isinstance(count, bool) or count <= listed:
        return None
    return (
        f"These are the first {listed:,} of {count:,} affected requests "
        f"(a finding lists at most {MAX_AFFECTED:,})."
    )


#: The tie-break after the sort key and trace id: fixed-size, whatever the request id is.
REQUEST_TIEBREAK_SQL = "hash(request_id)"
#: Most rows of one keyset a page takes (see `_search`): the same request stored that many times.
MAX_TIED_ROWS = 1_000


def _keyset(row: dict[str, Any]) -> tuple[Any, ...]:
    """Gives the row's place in the keyset order: what a cursor carries."""
    return row["sort_key"], row["trace_id"], row["request_tiebreak"]


def _sort_key(column: str, dtype: str) -> str:
    # NULL ("not measured") sorts as the smallest value so keyset comparisons stay total;
    # a text sorts by its first SORT_PREFIX_CHARS characters, which the cursor carries
    if dtype == "VARCHAR":
        return f'left(coalesce("{column}", \'\'), {SORT_PREFIX_CHARS})'
    return f'coalesce("{column}", -1)'


def search_error(query: Mapping[str, str], message: str) -> dict[str, Any]:
    """Gives the search page's data when its parameters are refused: no rows, the `error`, and
    the sort and order of `query` where they are valid (the form keeps them)."""
    sort = query.get("sort") if query.get("sort") in SORTABLE else "start_ns"
    order = query.get("order") if query.get("order") in ("asc", "desc") else "desc"
    return {"filters": {}, "sort": sort, "order": order, "columns": [], "total": 0, "rows": [],
            "truncated": False, "next": None, "note": None, "error": message}  # fmt: skip


def search_data(
    cur: duckdb.DuckDBPyConnection, p: SearchParams, report: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Gives one page of matching requests, the total count and the next page's cursor.

    `report` is the diagnosis of `p.view` whose findings a `complaint` filter reads (the
    caller waits for it: `ReportCache.wait`); None or {} when it is not ready: no finding.

    The page, its total and its window's anchor are read in one snapshot (a read
    transaction): under a live collector a commit between the queries gave "3 requests"
    over an empty page."""
    cur.execute("BEGIN TRANSACTION")
    try:
        return _search(cur, p, report)
    finally:
        cur.execute("ROLLBACK")  # a read: nothing to keep (also ends one a timeout aborted)


def _search(
    cur: duckdb.DuckDBPyConnection, p: SearchParams, report: dict[str, Any] | None
) -> dict[str, Any]:
    schema = table_columns(cur, "requests")
    if p.sort not in schema:
        raise ParamError(f"sort column {p.sort!r} is not in this database's requests table")
    filters = p.view.resolve(newest_start_ns(cur))
    where, params = filters.where()
    clauses = [where[len("WHERE ") :]] if where else []
    for expr, value in (
        ("e2e_ms >= ?", p.min_e2e_ms),
        ("e2e_ms <= ?", p.max_e2e_ms),
        ("ttft_ms >= ?", p.min_ttft_ms),
        ("ttft_ms <= ?", p.max_ttft_ms),
    ):
        if value is not None:
            clauses.append(expr)
            params.append(value)
    if p.bucket is not None:
        clauses.append(f"({DOMINANT_BUCKET_SQL}) = ?")
        params.append(p.bucket)
    if p.kept_only:
        clauses.append("kept")
    if p.errors_only:
        clauses.append("error")
    note = None
    if p.complaint is not None:
        ids = complaint_trace_ids(report or {}, p.complaint)
        if p.complaint not in COMPLAINTS:  # a typo must not read like "no such requests"
            note = f"unknown complaint {p.complaint!r}: one of {', '.join(COMPLAINTS)}"
            ids = []
        elif ids is None:
            note = f"This window has no {p.complaint!r} finding ({TITLES[p.complaint]}): nothing matches."
            ids = []
        else:
            note = affected_note(_finding(report or {}, p.complaint), len(ids))
        clauses.append("trace_id IN (SELECT unnest(?::VARCHAR[]))")
        params.append(ids)
    base_where = ("WHERE " + " AND ".join(clauses)) if clauses else ""

    key = _sort_key(p.sort, schema[p.sort])
    if p.after is not None and isinstance(p.after[0], str) != (schema[p.sort] == "VARCHAR"):
        raise ParamError("after is a cursor of another sort order; start from the first page")
    page_clauses = list(clauses)
    page_params = list(params)
    if p.after is not None:
        op = "<" if p.descending else ">"
        page_clauses.append(f"({key}, trace_id, {REQUEST_TIEBREAK_SQL}) {op} (?, ?, ?)")
        page_params.extend(p.after)
    page_where = ("WHERE " + " AND ".join(page_clauses)) if page_clauses else ""
    direction = "DESC" if p.descending else "ASC"
    columns = [c for c in RESULT_COLUMNS if c in schema]
    select = ", ".join(f'"{c}"' for c in columns)
    head = (
        f"SELECT {select}, {DOMINANT_BUCKET_SQL} AS dominant_bucket, {key} AS sort_key, "  # noqa: S608
        f"{REQUEST_TIEBREAK_SQL} AS request_tiebreak FROM requests"
    )
    order = f"ORDER BY sort_key {direction}, trace_id {direction}, request_tiebreak {direction}"
    # one row past the page: whether there is a next page, and whether it ties with the last
    rows, _ = fetch_dicts(cur, f"{head} {page_where} {order} LIMIT ?", [*page_params, p.limit + 1], cap=p.limit + 1)
    more = len(rows) > p.limit
    if more and _keyset(rows[p.limit]) == _keyset(rows[p.limit - 1]):
        # Rows the keyset cannot tell apart (a request stored twice by a re-sent export,
        # or request ids whose hashes collide) share one page: a cursor between them
        # would skip the rest of them.
        tie = _keyset(rows[p.limit - 1])
        same = f"({key}, trace_id, {REQUEST_TIEBREAK_SQL})"
        tied, _ = fetch_dicts(
            cur, f"{head} WHERE {' AND '.join([*clauses, f'{same} = (?, ?, ?)'])}", [*params, *tie], cap=MAX_TIED_ROWS
        )
        rows = [r for r in rows[: p.limit] if _keyset(r) != tie] + tied
        after = " AND ".join([*clauses, f"{same} {'<' if p.descending else '>'} (?, ?, ?)"])
        beyond, _ = fetch_dicts(cur, f"SELECT 1 FROM requests WHERE {after} LIMIT 1", [*params, *tie], cap=1)  # noqa: S608
        more = bool(beyond)
    else:
        rows = rows[: p.limit]
    with time_limit(cur):
        count_row = cur.execute(f"SELECT count(*) FROM requests {base_where}", params).fetchone()  # noqa: S608
    next_cursor = None
    if more and rows:
        next_cursor = _keyset(rows[-1])
    for row in rows:
        row.pop("sort_key")
        row.pop("request_tiebreak")
    return {
        "filters": p.query(after=None),
        "sort": p.sort,
        "order": "desc" if p.descending else "asc",
        "columns": columns,
        "total": int(count_row[0]) if count_row else 0,
        "rows": rows,
        "truncated": more,
        "next": p.query(after=next_cursor) if next_cursor is not None else None,
        "note": note,
    }
