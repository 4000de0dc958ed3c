"""The single DuckDB writer: one thread, fed by a bounded queue, owns the connection.

Everything the collector stores goes through here, so there is exactly one
write connection (DuckDB allows one writer process) and inserts are batched.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from typing import Any

import duckdb
import pyarrow as pa

from tokentrace.analyzer.engine_steps import EngineStep
from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.summary import COLUMNS, RequestSummary
from tokentrace.collector import itl_hist
from tokentrace.store.schema import ITL_BUCKET_BOUNDS_MS


def itl_histogram(gaps_ms: Sequence[float]) -> list[int]:
    """Gives gap counts over `ITL_BUCKET_BOUNDS_MS` (+1 overflow bucket)."""
    return itl_hist.itl_histogram(gaps_ms, ITL_BUCKET_BOUNDS_MS)


def itl_histograms(gap_lists: Sequence[Sequence[float]]) -> list[list[int]]:
    """`itl_histogram` of many requests at once (one numpy pass)."""
    return itl_hist.itl_histograms(gap_lists, ITL_BUCKET_BOUNDS_MS)

logger = logging.getLogger("tokentrace.collector")


@dataclass(slots=True)
class KeptTrace:
    trace_id: str
    reason: str
    weight: float
    decided_ns: int
    spans: Sequence[Span]


@dataclass(slots=True)
class WriteBatch:
    """What one decision round hands to the writer."""

    requests: list[RequestSummary] = field(default_factory=list)
    kept: list[KeptTrace] = field(default_factory=list)
    late_spans: list[Span] = field(default_factory=list)
    engine_steps: list[EngineStep] = field(default_factory=list)
    gpu_samples: list[dict[str, Any]] = field(default_factory=list)
    #: ITL histogram counts of `requests[i]` where a decode worker computed them
    #: (None: compute here); ignored unless as long as `requests`
    itl_counts: list[list[int] | None] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.requests or self.kept or self.late_spans or self.engine_steps or self.gpu_samples
        )


_request_row = attrgetter(*COLUMNS)


def _columns(requests: Sequence[RequestSummary]) -> list[list[Any]]:
    """The request rows column by column: one C-level attrgetter per row and a
    zip transpose, instead of a Python getattr per cell (~40 columns)."""
    return [list(col) for col in zip(*map(_request_row, requests), strict=True)]


_dumps = json.JSONEncoder(default=str, ensure_ascii=False).encode


def _span_rows(spans: Sequence[Span]) -> dict[str, list[Any]]:
    # The spans of one trace share one resource dict: encode it once.
    resources: dict[int, str] = {}

    def resource(s: Span) -> str:
        key = id(s.resource)
        text = resources.get(key)
        if text is None:
            text = resources[key] = _dumps(s.resource)
        return text

    return {
        "trace_id": [s.trace_id for s in spans],
        "span_id": [s.span_id for s in spans],
        "parent_span_id": [s.parent_span_id for s in spans],
        "name": [s.name for s in spans],
        "kind": [s.kind for s in spans],
        "start_ns": [s.start_ns for s in spans],
        "end_ns": [s.end_ns for s in spans],
        "status_code": [s.status_code for s in spans],
        "status_message": [s.status_message for s in spans],
        "service_name": [s.service_name for s in spans],
        "scope": [s.scope for s in spans],
        "attributes": [_dumps(s.attributes) for s in spans],
        "events": [
            _dumps([{"name": e.name, "time_ns": e.time_ns, "attributes": e.attributes} for e in s.events])
            if s.events
            else "[]"
            for s in spans
        ],
        "links": [_dumps([asdict(lk) for lk in s.links]) if s.links else "[]" for s in spans],
        "resource": [resource(s) for s in spans],
    }


def _itl_counts(items: list[WriteBatch], requests: list[RequestSummary]) -> list[list[int]]:
    """The ITL histogram of every request: the decode workers' where they sent
    them, the rest in one numpy pass."""
    counts: list[list[int] | None] = []
    for b in items:
        aligned = len(b.itl_counts) == len(b.requests)
        counts.extend(b.itl_counts if aligned else [None] * len(b.requests))
    missing = [i for i, c in enumerate(counts) if c is None]
    if missing:
        computed = itl_histograms([requests[i].itl_gaps_ms for i in missing])
        for i, c in zip(missing, computed, strict=True):
            counts[i] = c
    return counts  # type: ignore[return-value]


def _pieces(batch: WriteBatch) -> list[WriteBatch]:
    """Splits a batch into one batch per row (a request with its ITL histogram,
    a kept trace with its spans, a late span, an engine step, a GPU sample)."""
    aligned = len(batch.itl_counts) == len(batch.requests)
    return [
        *(WriteBatch(requests=[r], itl_counts=[batch.itl_counts[i]] if aligned else [])
          for i, r in enumerate(batch.requests)),
        *(WriteBatch(kept=[k]) for k in batch.kept),
        *(WriteBatch(late_spans=[s]) for s in batch.late_spans),
        *(WriteBatch(engine_steps=[st]) for st in batch.engine_steps),
        *(WriteBatch(gpu_samples=[g]) for g in batch.gpu_samples),
    ]  # fmt: skip


def _describe(piece: WriteBatch) -> str:
    if piece.requests:
        return f"request of trace {piece.requests[0].trace_id}"
    if piece.kept:
        return f"kept trace {piece.kept[0].trace_id}"
    if piece.late_spans:
        return f"late span of trace {piece.late_spans[0].trace_id}"
    return "engine step" if piece.engine_steps else "GPU sample"


class Writer:
    """Owns the write connection; `submit()` never blocks (False when full)."""

    def __init__(
        self,
        conn: duckdb.DuckDBPyConnection,
        max_pending: int = 256,
        clock: Callable[[], int] = time.time_ns,
        on_write: Callable[[float], None] | None = None,
    ) -> None:
        self._conn = conn
        self._queue: queue.Queue[WriteBatch | None] = queue.Queue(maxsize=max_pending)
        self._clock = clock
        self._thread = threading.Thread(target=self._run, name="tokentrace-writer", daemon=True)
        self._stopped = False
        self._on_write = on_write
        self.rows_written = 0
        self.requests_written = 0
        self.spans_written = 0
        self.gpu_samples_written = 0
        self.write_errors = 0
        self.last_write_seconds = 0.0
        self._thread.start()

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    @property
    def capacity(self) -> int:
        return self._queue.maxsize

    def submit(self, batch: WriteBatch) -> bool:
        """Queues a batch for writing; gives False (nothing queued) when full."""
        if not batch:
            return True
        try:
            self._queue.put_nowait(batch)
            return True
        except queue.Full:
            return False

    def submit_wait(self, batch: WriteBatch, timeout: float | None = None) -> bool:
        """Queues a batch, waiting for room (decision rounds, shutdown flush)."""
        if not batch:
            return True
        try:
            self._queue.put(batch, timeout=timeout)
            return True
        except queue.Full:
            return False

    def flush(self, timeout: float = 30.0) -> None:
        """Waits until everything queued so far is written."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self, timeout: float = 30.0) -> None:
        """Writes what is queued, then stops the thread; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        self._queue.put(None)
        self._thread.join(timeout)
        try:
            self._conn.execute("CHECKPOINT")
        except duckdb.Error:
            logger.exception("checkpoint at close failed")

    # ---- writer thread -------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            # Coalesce whatever else is waiting into one transaction.
            items = [item]
            stop = False
            while len(items) < 64:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                items.append(nxt)
            try:
                try:
                    self._write(items)
                except Exception:
                    logger.exception("tokentrace: write of %d batches failed; retrying them apart", len(items))
                    self._write_apart(items)
            finally:
                for _ in items:
                    self._queue.task_done()
            if stop:
                self._queue.task_done()
                return

    def _write_apart(self, items: list[WriteBatch]) -> None:
        """Writes every row that DuckDB takes after a failed write: one value it
        cannot take (a number beyond its column) fails the transaction of every
        batch coalesced with it, so the rows are split into halves until each
        failing row is alone; only those are dropped (and counted)."""
        pieces = [piece for batch in items for piece in _pieces(batch)]
        failed: list[WriteBatch] = []
        errors: list[Exception] = []
        self._bisect(pieces, failed, errors)
        if failed:
            self.write_errors += len(failed)
            logger.error(
                "tokentrace: dropped %d of %d rows DuckDB would not take (first: %s; error: %s)",
                len(failed), len(pieces), _describe(failed[0]), errors[0],
            )  # fmt: skip

    def _bisect(self, pieces: list[WriteBatch], failed: list[WriteBatch], errors: list[Exception]) -> None:
        if len(pieces) == 1:
            failed.extend(pieces)
            return
        mid = len(pieces) // 2
        for half in (pieces[:mid], pieces[mid:]):
            try:
                self._write(half)
            except Exception as exc:
                errors.append(exc)
                self._bisect(half, failed, errors)

    def _write(self, items: list[WriteBatch]) -> None:
        t0 = time.perf_counter()
        requests = [r for b in items for r in b.requests]
        spans = [s for b in items for k in b.kept for s in k.spans] + [
            s for b in items for s in b.late_spans
        ]
        kept = [k for b in items for k in b.kept]
        steps = [st for b in items for st in b.engine_steps]
        samples = [g for b in items for g in b.gpu_samples]
        conn = self._conn
        conn.execute("BEGIN TRANSACTION")
        try:
            if requests:
                # column-wise getattr: asdict() deep-copies every row and is the slow part
                table = pa.table(dict(zip(COLUMNS, _columns(requests), strict=True)))
                conn.register("_new_requests", table)
                conn.execute(f"INSERT INTO requests ({', '.join(COLUMNS)}) SELECT * FROM _new_requests")  # noqa: S608 - fixed column names
                conn.unregister("_new_requests")
                hist = pa.table(
                    {
                        "trace_id": [r.trace_id for r in requests],
                        "request_id": [r.request_id for r in requests],
                        "start_ns": [r.start_ns for r in requests],
                        "counts": _itl_counts(items, requests),
                    }
                )
                conn.register("_new_hist", hist)
                conn.execute("INSERT INTO itl_hist SELECT * FROM _new_hist")
                conn.unregister("_new_hist")
            if spans:
                conn.register("_new_spans", pa.table(_span_rows(spans)))
                conn.execute("INSERT INTO spans SELECT * FROM _new_spans")
                conn.unregister("_new_spans")
            if kept:
                conn.register(
                    "_new_kept",
                    pa.table(
                        {
                            "trace_id": [k.trace_id for k in kept],
                            "reason": [k.reason for k in kept],
                            "weight": pa.array([k.weight for k in kept], pa.float64()),
                            "decided_ns": pa.array([k.decided_ns for k in kept], pa.int64()),
                            "span_count": pa.array([len(k.spans) for k in kept], pa.int32()),
                        }
                    ),
                )
                conn.execute("INSERT INTO kept_traces SELECT * FROM _new_kept")
                conn.unregister("_new_kept")
            if steps:
                conn.register(
                    "_new_steps",
                    pa.table({f: [getattr(st, f) for st in steps] for f in EngineStep.__slots__}),
                )
                cols = ", ".join(EngineStep.__slots__)
                conn.execute(f"INSERT INTO engine_steps ({cols}) SELECT {cols} FROM _new_steps")  # noqa: S608 - dataclass field names
                conn.unregister("_new_steps")
            if samples:
                conn.register("_new_gpu", pa.Table.from_pylist(samples))
                names = ", ".join(samples[0].keys())
                conn.execute(f"INSERT INTO gpu_samples ({names}) SELECT {names} FROM _new_gpu")  # noqa: S608 - fixed keys from the metrics decoder
                conn.unregister("_new_gpu")
            conn.execute("COMMIT")
        except Exception:
            conn.execute("ROLLBACK")
            raise
        self.rows_written += len(requests) + len(spans) + len(steps) + len(samples)
        self.requests_written += len(requests)
        self.spans_written += len(spans)
        self.gpu_samples_written += len(samples)
        self.last_write_seconds = time.perf_counter() - t0
        if self._on_write is not None:
            self._on_write(self.last_write_seconds)
