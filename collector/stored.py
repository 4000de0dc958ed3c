"""What the store already holds of re-sent traces: the writer's idempotence check.

The tail buffer counts a span once (`PendingTrace.drop_repeats`) and the decision cache
sends the spans of a trace decided in the last 100 000 to its decision (`DecisionCache`):
a re-sent export within that reach is never summarized twice.  Beyond it (the cache
forgot the trace, another `serve` process wrote it, `tokentrace import` of the same
file twice) the trace is decided anew, and its decision round marks it for a recheck
(`WriteBatch.recheck`).  The writer then reads, in its write transaction, what the
store holds of those traces and leaves it out: the first copy written wins.

- a request row (and its `itl_hist` row) whose (trace_id, request_id) is stored,
  among the stored requests that started within `RESEND_MARGIN_NS` of the re-sent
  ones (a request without a request id is matched by its start too);
- the `kept_traces` row of a trace stored kept;
- the spans of a trace stored dropped (its summary is stored, its spans were not
  kept: the first decision holds), and the span ids a trace stored kept holds.

`requests` has no index (schema version 2 dropped it: it doubled the cost of the
every-request insert), so its look-up scans the requests that started in the
window: DuckDB's zone maps on `start_ns` skip the rest.  `spans` and `kept_traces`
are looked up through their `trace_id` indexes.  Only rechecked traces pay.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.summary import RequestSummary

if TYPE_CHECKING:
    from tokentrace.collector.writer import WriteBatch

#: How far apart the starts of two copies of a request may be and still be found:
#: a re-sent part of a trace (the engine's spans without the client's) may start
#: its request a little later than the stored copy did.
RESEND_MARGIN_NS = 5_000_000_000
#: Trace ids up to this many are bound as an IN list (DuckDB's index look-ups);
#: more are joined from a registered table.
_MAX_BOUND_IDS = 64


def stored_until_ns(conn: duckdb.DuckDBPyConnection) -> int:
    """Gives the latest start (unix ns) of a stored request or kept span, 0 for none:
    read from DuckDB's column statistics, not a scan."""
    [(requests, spans)] = conn.execute(
        "SELECT (SELECT max(start_ns) FROM requests), (SELECT max(start_ns) FROM spans)"
    ).fetchall()
    return max(int(requests or 0), int(spans or 0))


def _ids_condition(
    conn: duckdb.DuckDBPyConnection, ids: Collection[str], registered: list[str]
) -> tuple[str, list[Any]]:
    """Gives the SQL condition `trace_id IN (the ids)` and its parameters; a table it
    registers is named in `registered` (for the caller to unregister)."""
    if len(ids) <= _MAX_BOUND_IDS:
        return f"trace_id IN ({', '.join('?' * len(ids))})", list(ids)
    name = f"_recheck_ids{len(registered)}"
    conn.register(name, pa.table({"trace_id": list(ids)}))
    registered.append(name)
    return f"trace_id IN (SELECT trace_id FROM {name})", []  # noqa: S608 - our own name


def _request_key(trace_id: str, request_id: str | None, start_ns: int) -> tuple[str, str | int]:
    """Gives what tells a stored request from another: (trace_id, request_id), or for a
    request without an id, (trace_id, start_ns)."""
    return (trace_id, request_id) if request_id else (trace_id, start_ns)


@dataclass(slots=True)
class StoredRows:
    """What the store holds of the traces rechecked in one write."""

    #: the traces rechecked
    recheck: set[str] = field(default_factory=set)
    #: stored requests, as `_request_key` gives them
    request_keys: set[tuple[str, str | int]] = field(default_factory=set)
    #: traces with a stored request row (decided before), and those stored kept
    decided: set[str] = field(default_factory=set)
    kept: set[str] = field(default_factory=set)
    #: span ids stored, per trace
    span_ids: dict[str, set[str]] = field(default_factory=dict)
    requests_left_out: int = 0
    spans_left_out: int = 0
    #: kept traces not written as kept: the store held the trace (kept, or its summary)
    kept_left_out: int = 0

    @classmethod
    def read(
        cls,
        conn: duckdb.DuckDBPyConnection,
        recheck: set[str],
        requests: Sequence[RequestSummary],
    ) -> StoredRows:
        """Reads what the store holds of the `recheck` traces (in the caller's transaction)."""
        stored = cls(recheck)
        starts = [r.start_ns for r in requests if r.trace_id in recheck]
        registered: list[str] = []
        try:
            where, params = _ids_condition(conn, recheck, registered)
            if starts:
                rows = conn.execute(
                    "SELECT trace_id, request_id, start_ns FROM requests "  # noqa: S608 - fixed SQL
                    f"WHERE start_ns BETWEEN ? AND ? AND {where}",
                    [min(starts) - RESEND_MARGIN_NS, max(starts) + RESEND_MARGIN_NS, *params],
                ).fetchall()
                for trace_id, request_id, start_ns in rows:
                    stored.decided.add(trace_id)
                    stored.request_keys.add(_request_key(trace_id, request_id, start_ns))
            sql = f"SELECT trace_id FROM kept_traces WHERE {where}"  # noqa: S608 - fixed SQL
            rows = conn.execute(sql, params).fetchall()
            stored.kept.update(trace_id for (trace_id,) in rows)
            if stored.kept:
                where, params = _ids_condition(conn, stored.kept, registered)
                sql = f"SELECT trace_id, span_id FROM spans WHERE {where}"  # noqa: S608 - fixed SQL
                rows = conn.execute(sql, params).fetchall()
                for trace_id, span_id in rows:
                    stored.span_ids.setdefault(trace_id, set()).add(span_id)
        finally:
            for name in registered:
                conn.unregister(name)
        stored.decided |= stored.kept
        return stored

    def _span_stored(self, s: Span) -> bool:
        """Whether the span is left out: its trace was stored dropped, or stored kept
        with this span id (the ids are added as spans are let through: a span twice in
        one write is written once)."""
        trace_id = s.trace_id
        if trace_id not in self.decided:
            return False
        if trace_id not in self.kept:
            return True
        ids = self.span_ids.setdefault(trace_id, set())
        if s.span_id in ids:
            return True
        ids.add(s.span_id)
        return False

    def leave_out(self, batch: WriteBatch) -> WriteBatch:
        """Gives the batch without the rows the store holds (first copy wins), and
        counts what it writes of the rechecked traces as stored: the batches of one
        write are taken in order, and a later one may hold a copy of an earlier one's
        trace (the first copy, decided before the cache forgot it, is not rechecked)."""
        recheck = self.recheck
        late: list[Span] = []
        kept = []
        for k in batch.kept:
            if k.trace_id in self.decided:  # decided before: its new spans are late spans
                late.extend(s for s in k.spans if not self._span_stored(s))
            else:
                kept.append(k)
        late.extend(s for s in batch.late_spans if not self._span_stored(s))
        aligned = len(batch.itl_counts) == len(batch.requests)
        requests, counts = [], []
        for i, r in enumerate(batch.requests):
            if (
                r.trace_id in recheck
                and _request_key(r.trace_id, r.request_id, r.start_ns) in self.request_keys
            ):
                continue
            requests.append(r)
            if aligned:
                counts.append(batch.itl_counts[i])
        self.requests_left_out += len(batch.requests) - len(requests)
        self.kept_left_out += len(batch.kept) - len(kept)
        self.spans_left_out += (
            len(batch.late_spans) + sum(len(k.spans) for k in batch.kept)
            - len(late) - sum(len(k.spans) for k in kept)
        )  # fmt: skip
        for r in requests:
            if r.trace_id in recheck:
                self.decided.add(r.trace_id)
                self.request_keys.add(_request_key(r.trace_id, r.request_id, r.start_ns))
        for k in kept:
            if k.trace_id in recheck:
                self.decided.add(k.trace_id)
                self.kept.add(k.trace_id)
                self.span_ids.setdefault(k.trace_id, set()).update(s.span_id for s in k.spans)
        return replace(batch, requests=requests, itl_counts=counts, kept=kept, late_spans=late)


#: What tells a stored engine step or GPU sample from another (they have no trace id).
_STEP_KEY = ("service", "instance", "start_ns", "duration_us")
_SAMPLE_KEY = ("service", "instance", "gpu_index", "ts_ns")


def leave_out_engine_data(
    conn: duckdb.DuckDBPyConnection, items: list[WriteBatch]
) -> list[WriteBatch]:
    """Gives the batches without the engine steps and GPU samples of replayed batches
    (`WriteBatch.replayed`) that the store holds: a write-ahead-log record replayed at start
    may hold rows committed before the stop, and these tables have no trace to recheck.
    Read in the caller's write transaction; only a replay pays."""
    steps = [st for b in items if b.replayed for st in b.engine_steps]
    samples = [g for b in items if b.replayed for g in b.gpu_samples]
    stored_steps = _stored_keys(
        conn, "engine_steps", _STEP_KEY, [tuple(getattr(st, k) for k in _STEP_KEY) for st in steps]
    )
    stored_samples = _stored_keys(
        conn, "gpu_samples", _SAMPLE_KEY, [tuple(g.get(k) for k in _SAMPLE_KEY) for g in samples]
    )
    if not stored_steps and not stored_samples:
        return items
    return [
        replace(
            b,
            engine_steps=[
                st
                for st in b.engine_steps
                if tuple(getattr(st, k) for k in _STEP_KEY) not in stored_steps
            ],
            gpu_samples=[
                g
                for g in b.gpu_samples
                if tuple(g.get(k) for k in _SAMPLE_KEY) not in stored_samples
            ],
        )
        if b.replayed
        else b
        for b in items
    ]


def _stored_keys(
    conn: duckdb.DuckDBPyConnection, table: str, key: tuple[str, ...], wanted: list[tuple[Any, ...]]
) -> set[tuple[Any, ...]]:
    """Gives those of the `wanted` keys (values of the `key` columns) that `table` holds."""
    if not wanted:
        return set()
    conn.register(
        "_replayed_keys", pa.table({k: [w[i] for w in wanted] for i, k in enumerate(key)})
    )
    try:
        names = ", ".join(key)
        rows = conn.execute(
            f"SELECT DISTINCT {names} FROM {table} SEMI JOIN _replayed_keys USING ({names})"  # noqa: S608 - fixed names
        ).fetchall()
    finally:
        conn.unregister("_replayed_keys")
    return {tuple(r) for r in rows}
