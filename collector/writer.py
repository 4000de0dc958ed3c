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

from tokentrace.analyzer.engine_starts import EngineStart
from tokentrace.analyzer.engine_steps import EngineStep
from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.summary import COLUMNS, RequestSummary
from tokentrace.collector import itl_hist
from tokentrace.collector.itl_rollup import rollup_table
from tokentrace.collector.stored import StoredRows, leave_out_engine_data, stored_until_ns
from tokentrace.store.schema import ITL_BUCKET_BOUNDS_MS


def itl_histogram(gaps_ms: Sequence[float]) -> list[int]:
    """Gives gap counts over `ITL_BUCKET_BOUNDS_MS` (+1 overflow bucket)."""
    return itl_hist.itl_histogram(gaps_ms, ITL_BUCKET_BOUNDS_MS)


def itl_histograms(gap_lists: Sequence[Sequence[float]]) -> list[list[int]]:
    """`itl_histogram` of many requests at once (one numpy pass)."""
    return itl_hist.itl_histograms(gap_lists, ITL_BUCKET_BOUNDS_MS)

logger = logging.getLogger("tokentrace.collector")

#: Errors about the store, not the rows: the disk is full or failing, DuckDB ran
#: out of memory or invalidated the database, the connection is in a bad state.
#: The rows are kept and retried (`Writer`), never dropped or bisected.
STORE_ERRORS: tuple[type[BaseException], ...] = (
    duckdb.IOException,
    duckdb.OutOfMemoryException,
    duckdb.FatalException,
    duckdb.InternalException,
    duckdb.TransactionException,
    duckdb.ConnectionException,
    duckdb.PermissionException,
    duckdb.InterruptException,
    OSError,
    MemoryError,
)
#: ... and these words in any error's message (a wrapped IOException).
_STORE_WORDS = (
    "no space left", "disk full", "out of space", "quota exceeded", "read-only file system",
    "database has been invalidated", "i/o error", "input/output error",
)  # fmt: skip
#: Backoff between retries of a write the store refused: first, then doubled up to the last.
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 10.0
#: Rows DuckDB would not take are logged with their reason at most this often
#: (the first time with a traceback); the ones in between are counted in the next line.
DROP_LOG_EVERY_S = 60.0
#: How often a decision round waiting for room in a full queue looks whether the writer
#: thread still runs: one that stopped never makes room, and the round would wait forever
#: (holding the decide lock, so that the shutdown flush would too).
ALIVE_CHECK_S = 0.25


def is_store_error(exc: BaseException) -> bool:
    """Whether a failed write is the store's fault (retry it all later) rather
    than a row's (find the row, drop it)."""
    if isinstance(exc, STORE_ERRORS):
        return True
    text = str(exc).lower()
    return any(word in text for word in _STORE_WORDS)


class _GaveUp(Exception):
    """The store stayed unwritable until the writer's close deadline."""


@dataclass(slots=True)
class KeptTrace:
    trace_id: str
    reason: str
    weight: float
    decided_ns: int
    spans: Sequence[Span]


@dataclass(slots=True)
class UnmatchedTrace:
    """A trace that matched no span convention (no request, no start-up, no engine steps):
    what the report's coverage counts and names by its root span."""

    trace_id: str
    start_ns: int
    service: str
    root_name: str
    span_count: int


@dataclass(slots=True)
class WriteBatch:
    """What one decision round hands to the writer."""

    requests: list[RequestSummary] = field(default_factory=list)
    kept: list[KeptTrace] = field(default_factory=list)
    late_spans: list[Span] = field(default_factory=list)
    engine_steps: list[EngineStep] = field(default_factory=list)
    gpu_samples: list[dict[str, Any]] = field(default_factory=list)
    #: engine start-ups (their traces are kept whole, in `kept`)
    engine_starts: list[EngineStart] = field(default_factory=list)
    unmatched: list[UnmatchedTrace] = field(default_factory=list)
    #: ITL histogram counts of `requests[i]` where a decode worker computed them
    #: (None: compute here); ignored unless as long as `requests`
    itl_counts: list[list[int] | None] = field(default_factory=list)
    #: traces whose rows the store may hold already (a re-sent export whose first copy
    #: was written before the decision cache, or this process, knew it): the writer
    #: leaves out what is stored (`stored.StoredRows`)
    recheck: set[str] = field(default_factory=set)
    #: the first OTLP write-ahead-log record a restart must replay once this batch, and every
    #: batch before it, is committed (`tokentrace.collector.wal`); None: no WAL, or no change
    wal_from: int | None = None
    #: the engine steps / GPU samples came from the write-ahead log's replay at start: a
    #: record past the checkpoint may hold rows committed before the stop; the writer leaves
    #: out those the store holds (`stored.leave_out_engine_data`)
    replayed: bool = False

    def __bool__(self) -> bool:
        return bool(
            self.requests or self.kept or self.late_spans or self.engine_steps or self.gpu_samples
            or self.engine_starts or self.unmatched or self.wal_from is not None
        )  # fmt: skip

    def row_count(self) -> int:
        """Gives how many rows the batch holds, as the writer counts them: each request
        summary, kept trace (with its spans), late span, engine step, GPU sample, engine
        start or unmatched trace one."""
        return (
            len(self.requests) + len(self.kept) + len(self.late_spans) + len(self.engine_steps)
            + len(self.gpu_samples) + len(self.engine_starts) + len(self.unmatched)
        )  # fmt: skip


_request_row = attrgetter(*COLUMNS)


def _columns(requests: Sequence[RequestSummary]) -> list[list[Any]]:
    """The request rows column by column: one C-level attrgetter per row and a
    zip transpose, instead of a Python getattr per cell (~40 columns)."""
    return [list(col) for col in zip(*map(_request_row, requests), strict=True)]


_dumps = json.JSONEncoder(default=str, ensure_ascii=False).encode


#: The columns of `spans` that `_span_rows` gives, in its order.
SPAN_COLUMNS: tuple[str, ...] = (
    "trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns",
    "status_code", "status_message", "service_name", "scope", "attributes", "events", "links",
    "resource",
)  # fmt: skip


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
        *(WriteBatch(engine_starts=[e], recheck=batch.recheck) for e in batch.engine_starts),
        *(WriteBatch(unmatched=[u], recheck=batch.recheck) for u in batch.unmatched),
    ]  # fmt: skip


def _rows(batch: WriteBatch) -> list[object]:
    return [
        *batch.requests, *batch.kept, *batch.late_spans, *batch.engine_steps, *batch.gpu_samples,
        *batch.engine_starts, *batch.unmatched,
    ]  # fmt: skip


def _rollback(conn: duckdb.DuckDBPyConnection, original: BaseException, quiet: bool = False) -> None:
    """Rolls back after a failed write.  When ROLLBACK fails too (DuckDB
    already ended the transaction: "cannot rollback - no transaction is
    active"), that is logged with the original error as its cause and the
    caller raises the original: it, not the ROLLBACK's, says what went wrong."""
    try:
        conn.execute("ROLLBACK")
    except Exception as rollback_error:
        rollback_error.__cause__ = original
        logger.log(
            logging.DEBUG if quiet else logging.WARNING,
            "tokentrace: ROLLBACK after a failed write failed too (%s); the write's error: %s: %s",
            rollback_error, type(original).__name__, original,
            exc_info=rollback_error,
        )  # fmt: skip


def _describe(piece: WriteBatch) -> str:
    if piece.requests:
        return f"request of trace {piece.requests[0].trace_id}"
    if piece.kept:
        return f"kept trace {piece.kept[0].trace_id}"
    if piece.late_spans:
        return f"late span of trace {piece.late_spans[0].trace_id}"
    if piece.engine_starts:
        return f"engine start of trace {piece.engine_starts[0].trace_id}"
    if piece.unmatched:
        return f"unmatched trace {piece.unmatched[0].trace_id}"
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
        #: rows of re-sent traces left out because the store held them already
        self.requests_already_stored = 0
        self.spans_already_stored = 0
        #: traces decided kept that the store held already: not kept whole again
        self.kept_already_stored = 0
        #: the latest start (unix ns) of a request or a kept span stored before this
        #: writer opened the store (0: none): a trace that started later cannot have
        #: been written before (`Pipeline` rechecks only the ones that started earlier)
        self.stored_until_ns = stored_until_ns(conn)
        #: the `commit_seq` of the last transaction committed (0: none yet); every row a
        #: transaction writes carries its seq, and `commit_log` has a row for it
        self.last_seq = last_commit_seq(conn)
        #: the newest `wal_from` committed (None: none yet in this store)
        self.wal_from = wal_checkpoint(conn)
        self.write_errors = 0
        self.last_write_seconds = 0.0
        # batches taken off the queue and not written yet (coalesced, or waiting
        # for the store to take them again)
        self._held = 0
        # store state: the error of the current outage (None while writes work),
        # when it began, retries so far, most batches that waited in it
        self._store_error: BaseException | None = None
        self._failing_since = 0.0
        self._failed_attempts = 0
        self._most_waiting = 0
        self._last_ok = time.monotonic()
        #: rows dropped because the store stayed unwritable until close's deadline
        self.rows_lost_at_close = 0
        self._deadline: float | None = None
        self._wake = threading.Event()
        # rows dropped as DuckDB would not take them: when that was last logged,
        # and how many were dropped since without a line of their own
        self._drop_logged_at: float | None = None
        self._drops_unlogged = 0
        #: why the writer thread ended before `close()` (None while it runs):
        #: a bug; the store then takes no writes and the receivers refuse exports
        self._dead: BaseException | None = None
        self._dead_since = 0.0
        self._thread.start()

    @property
    def pending(self) -> int:
        """Batches waiting: queued, and taken by the writer but not yet written."""
        return self._queue.qsize() + self._held

    @property
    def store_error(self) -> str | None:
        """Why the store takes no writes now (the original error, or the writer
        thread's death), None while it does."""
        dead = self._dead
        if dead is not None:
            return (
                f"the writer thread stopped ({type(dead).__name__}: {dead}): nothing more is "
                "written, restart the collector"
            )
        exc = self._store_error
        return None if exc is None else f"{type(exc).__name__}: {exc}"

    @property
    def store_writable(self) -> bool:
        return self._store_error is None and self._dead is None

    @property
    def stopped(self) -> bool:
        """Whether the writer thread ended before `close()`: nothing more is written."""
        return self._dead is not None

    @property
    def failing_for_seconds(self) -> float:
        """How long writes have been failing (0 while they work)."""
        if self._dead is not None:
            return time.monotonic() - self._dead_since
        return time.monotonic() - self._failing_since if self._store_error is not None else 0.0

    @property
    def seconds_since_write(self) -> float:
        """Seconds since the last committed write (since start before the first)."""
        return time.monotonic() - self._last_ok

    @property
    def capacity(self) -> int:
        return self._queue.maxsize

    def submit(self, batch: WriteBatch) -> bool:
        """Queues a batch for writing; gives False (nothing queued) when full."""
        if not batch:
            return True
        if self._dead is not None:  # nobody would ever write it
            return False
        try:
            self._queue.put_nowait(batch)
            return True
        except queue.Full:
            return False

    def submit_wait(self, batch: WriteBatch, timeout: float | None = None) -> bool:
        """Queues a batch, waiting for room (decision rounds, shutdown flush); False
        (nothing queued) once `timeout` has passed, or when the writer thread has
        stopped, before the call or while it waits: nobody would ever write the batch,
        nor make room for it."""
        if not batch:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._dead is None:
            wait = ALIVE_CHECK_S
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - time.monotonic()))
            try:
                self._queue.put(batch, timeout=wait)
                return True
            except queue.Full:
                if deadline is not None and time.monotonic() >= deadline:
                    return False
        return False

    def flush(self, timeout: float = 30.0) -> None:
        """Waits until everything queued so far is written (not for a writer thread that
        has stopped: nothing would be)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and self._dead is None and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self, timeout: float = 30.0) -> None:
        """Writes what is queued, then stops the thread; safe to call twice.

        Should the store refuse writes until `timeout` has passed, what is still
        waiting is dropped and logged (`rows_lost_at_close`): shutdown is bounded."""
        if self._stopped:
            return
        self._stopped = True
        self._deadline = time.monotonic() + timeout
        self._wake.set()  # a writer waiting out a backoff retries now
        if self._dead is not None or not self._thread.is_alive():
            self._drop_queued_of_dead_writer()
        else:
            try:
                self._queue.put(None, timeout=timeout)
            except queue.Full:
                pass  # the writer gives up at the deadline and stops anyway
            self._thread.join(max(0.0, self._deadline - time.monotonic()) + RETRY_MAX_S)
        try:
            self._conn.execute("CHECKPOINT")
        except duckdb.Error:
            logger.exception("checkpoint at close failed")

    # ---- writer thread -------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                try:
                    if not self._step():
                        return
                except Exception as exc:  # a bug: say so, keep writing what comes next
                    logger.error(
                        "tokentrace: the DuckDB writer hit an unexpected error (%s: %s); "
                        "it keeps running", type(exc).__name__, exc, exc_info=exc,
                    )  # fmt: skip
        except BaseException as exc:  # not even that: receivers refuse exports from now on
            self._dead_since = time.monotonic()
            self._dead = exc
            logger.critical(
                "tokentrace: the DuckDB writer thread stopped (%s: %s): nothing more is "
                "written; exports are refused (503) and /readyz says so: restart the collector",
                type(exc).__name__, exc, exc_info=exc,
            )  # fmt: skip

    def _step(self) -> bool:
        """Takes what is queued (up to 64 batches) and writes it in one
        transaction; False once `close()`'s stop has been taken."""
        item = self._queue.get()
        if item is None:
            self._queue.task_done()
            return False
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
        self._held = len(items)
        gave_up = False
        try:
            self._write_items(items)
        except _GaveUp:
            gave_up = True
            self._give_up(items, stop)
        except Exception as exc:  # a bug in the writer itself, not a row's or the store's fault
            rows = sum(len(_rows(b)) for b in items)
            logger.error(
                "tokentrace: the DuckDB writer failed unexpectedly on %d batches (%d rows, "
                "some of them may not be written) (%s: %s); it keeps running",
                len(items), rows, type(exc).__name__, exc, exc_info=exc,
            )  # fmt: skip
        finally:
            self._held = 0
            for _ in items:
                self._queue.task_done()
        if gave_up:
            return False
        if stop:
            self._queue.task_done()
            return False
        return True

    def _drain_lost(self, lost: list[WriteBatch]) -> tuple[list[WriteBatch], int]:
        """At close, when nothing more can be written: empties the queue into `lost`;
        gives it and its row count (added to `rows_lost_at_close`)."""
        while True:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            self._queue.task_done()
            if nxt is not None:
                lost.append(nxt)
        rows = sum(len(_rows(b)) for b in lost)
        self.rows_lost_at_close += rows
        return lost, rows

    def _drop_queued_of_dead_writer(self) -> None:
        """At close, with the writer thread gone: what waits can never be written."""
        lost, rows = self._drain_lost([])
        if lost:
            logger.error(
                "tokentrace: shutting down with the writer thread stopped (%s): %d batches "
                "(%d rows) could not be written",
                self.store_error, len(lost), rows,
            )  # fmt: skip

    def _write_items(self, items: list[WriteBatch]) -> None:
        try:
            self._write_retrying(items)
        except _GaveUp:
            raise
        except Exception as exc:
            logger.debug("tokentrace: write of %d batches failed (%s); retrying them apart", len(items), exc)
            self._write_apart(items, exc)

    def _write_retrying(self, items: list[WriteBatch]) -> None:
        """Writes the batches in one transaction.  While the store refuses
        writes (`is_store_error`) the same batches are retried with a backoff,
        the ones behind them wait in the queue (which fills: receivers answer
        503); nothing is dropped.  Raises the error of a row DuckDB will not
        take, or `_GaveUp` past close's deadline."""
        delay = RETRY_FIRST_S
        while True:
            try:
                self._write(items)
            except Exception as exc:
                if not is_store_error(exc):
                    raise
                self._store_failed(exc, len(items))
                deadline = self._deadline
                if deadline is not None and time.monotonic() >= deadline:
                    raise _GaveUp from exc
                wait = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
                self._wake.wait(wait)
                self._wake.clear()
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            self._store_recovered()
            return

    def _store_failed(self, exc: BaseException, in_hand: int) -> None:
        waiting = self._queue.qsize() + max(self._held, in_hand)
        self._failed_attempts += 1
        self._most_waiting = max(self._most_waiting, waiting)
        if self._store_error is None:
            self._failing_since = time.monotonic()
            self._store_error = exc
            logger.error(
                "tokentrace: the store takes no writes (%s: %s); keeping %d batches and "
                "retrying every %.1f-%.0f s, receivers answer 503 once the queue is full",
                type(exc).__name__, exc, waiting, RETRY_FIRST_S, RETRY_MAX_S,
                exc_info=exc,
            )  # fmt: skip
        else:
            self._store_error = exc  # the latest reason, for /readyz

    def _store_recovered(self) -> None:
        self._last_ok = time.monotonic()
        if self._store_error is None:
            return
        logger.warning(
            "tokentrace: the store takes writes again after %.1f s (%d failed attempts); "
            "%d batches waited, none lost",
            time.monotonic() - self._failing_since, self._failed_attempts, self._most_waiting,
        )  # fmt: skip
        self._store_error = None
        self._failed_attempts = 0
        self._most_waiting = 0

    def _give_up(self, items: list[WriteBatch], stop_taken: bool) -> None:
        """At close's deadline with the store still failing: drops what waits (logged)."""
        if stop_taken:  # the close sentinel came with `items`
            self._queue.task_done()
        lost, rows = self._drain_lost(list(items))
        logger.error(
            "tokentrace: shutting down with the store still failing (%s): %d batches "
            "(%d rows) could not be written",
            self.store_error, len(lost), rows,
        )  # fmt: skip

    def _write_apart(self, items: list[WriteBatch], error: Exception) -> None:
        """Writes every row that DuckDB takes after a failed write (`error`): one
        value it cannot take (a number beyond its column) fails the transaction of
        every batch coalesced with it, so the rows are split into halves until each
        failing row is alone; only those are dropped (counted, and logged with
        the reason DuckDB gave)."""
        pieces = [piece for batch in items for piece in _pieces(batch)]
        failed: list[tuple[WriteBatch, Exception]] = []
        self._bisect(pieces, error, failed)
        wal_from = max((b.wal_from for b in items if b.wal_from is not None), default=None)
        if wal_from is not None:  # every piece is written or dropped: the batches are done
            self._write_retrying([WriteBatch(wal_from=wal_from)])
        if failed:
            self._log_dropped(failed, len(pieces))
        else:  # every row went in when written apart: say what the first write met
            logger.warning(
                "tokentrace: a write of %d rows failed (%s: %s) but each of them was written "
                "when retried apart", len(pieces), type(error).__name__, error,
            )  # fmt: skip

    def _bisect(
        self, pieces: list[WriteBatch], error: Exception, failed: list[tuple[WriteBatch, Exception]]
    ) -> None:
        """`pieces` failed to write together with `error`: writes what of them
        DuckDB takes; each row it refuses alone goes to `failed` with its error."""
        if len(pieces) <= 1:
            failed.extend((piece, error) for piece in pieces)
            return
        mid = len(pieces) // 2
        for half in (pieces[:mid], pieces[mid:]):
            try:
                # a store failure here waits and retries, like any write
                self._write_retrying(half)
            except _GaveUp:
                raise
            except Exception as exc:
                self._bisect(half, exc, failed)

    def _log_dropped(self, failed: list[tuple[WriteBatch, Exception]], total: int) -> None:
        """Counts the dropped rows; logs them with the reason, at most once every
        `DROP_LOG_EVERY_S` (a sender repeating a bad value must not flood the log)."""
        self.write_errors += len(failed)
        self._drops_unlogged += len(failed)
        now = time.monotonic()
        last = self._drop_logged_at
        if last is not None and now - last < DROP_LOG_EVERY_S:
            return
        first = last is None
        piece, error = failed[0]
        since = self._drops_unlogged - len(failed)
        logger.error(
            "tokentrace: dropped %d of %d rows DuckDB would not take, the others were written "
            "(first: %s; error: %s: %s)%s",
            len(failed), total, _describe(piece), type(error).__name__, error,
            f"; {since} more rows were dropped since the last such message" if since else "",
            exc_info=error if first else None,
        )  # fmt: skip
        self._drop_logged_at = now
        self._drops_unlogged = 0

    def _write(self, items: list[WriteBatch]) -> None:
        t0 = time.perf_counter()
        conn = self._conn
        seq = self.last_seq + 1
        # a piece of a batch split apart (`_pieces`) carries no checkpoint: the batch's own
        # is committed once all of its pieces are (`_write_apart`)
        wal_from = max((b.wal_from for b in items if b.wal_from is not None), default=None)
        conn.execute("BEGIN TRANSACTION")
        try:
            requests, spans, samples, steps, stored = self._write_rows(conn, items, seq)
            notes = _write_trace_notes(conn, items, seq)
            _log_commit(conn, seq, self._clock(), wal_from)
            conn.execute("COMMIT")
        except Exception as exc:
            # logged once an outage, not at every retry
            _rollback(conn, exc, quiet=self._store_error is not None)
            raise
        self.last_seq = seq
        if wal_from is not None:
            self.wal_from = wal_from
        self.rows_written += len(requests) + len(spans) + len(steps) + len(samples) + notes
        self.requests_written += len(requests)
        self.spans_written += len(spans)
        self.gpu_samples_written += len(samples)
        if stored is not None:
            self.requests_already_stored += stored.requests_left_out
            self.spans_already_stored += stored.spans_left_out
            self.kept_already_stored += stored.kept_left_out
        self.last_write_seconds = time.perf_counter() - t0
        if self._on_write is not None:
            self._on_write(self.last_write_seconds)

    def _write_rows(
        self, conn: duckdb.DuckDBPyConnection, items: list[WriteBatch], seq: int
    ) -> tuple[list[RequestSummary], list[Span], list[dict[str, Any]], list[EngineStep], StoredRows | None]:
        """Inserts the batches' rows in the caller's transaction, but for those of
        re-sent traces the store holds (`StoredRows`); gives what it inserted."""
        recheck = set().union(*(b.recheck for b in items))
        stored = None
        if recheck:  # in the transaction: the single writer's view of the store is final
            stored = StoredRows.read(conn, recheck, [r for b in items for r in b.requests])
            items = [stored.leave_out(b) for b in items]
        if any(b.replayed for b in items):
            items = leave_out_engine_data(conn, items)
        requests = [r for b in items for r in b.requests]
        spans = [s for b in items for k in b.kept for s in k.spans] + [
            s for b in items for s in b.late_spans
        ]
        kept = [k for b in items for k in b.kept]
        steps = [st for b in items for st in b.engine_steps]
        samples = [g for b in items for g in b.gpu_samples]
        if requests:
            counts = _itl_counts(items, requests)
            # column-wise getattr: asdict() deep-copies every row and is the slow part
            table = pa.table(dict(zip(COLUMNS, _columns(requests), strict=True)))
            conn.register("_new_requests", table)
            conn.execute(
                f"INSERT INTO requests ({', '.join(COLUMNS)}, commit_seq) SELECT *, $seq FROM _new_requests",  # noqa: S608 - fixed column names
                {"seq": seq},
            )
            conn.unregister("_new_requests")
            hist = pa.table(
                {
                    "trace_id": [r.trace_id for r in requests],
                    "request_id": [r.request_id for r in requests],
                    "start_ns": [r.start_ns for r in requests],
                    "counts": counts,
                }
            )
            conn.register("_new_hist", hist)
            conn.execute(
                "INSERT INTO itl_hist (trace_id, request_id, start_ns, counts, commit_seq) "
                "SELECT *, $seq FROM _new_hist",
                {"seq": seq},
            )
            conn.unregister("_new_hist")
            # the same histograms summed per minute and slice, in the same transaction
            conn.register("_new_rollup", rollup_table(requests, counts))
            conn.execute(
                "INSERT INTO itl_rollup (minute_ns, service, model, tenant, traffic_class, "
                "requests, counts, commit_seq) SELECT *, $seq FROM _new_rollup",
                {"seq": seq},
            )
            conn.unregister("_new_rollup")
        if spans:
            conn.register("_new_spans", pa.table(_span_rows(spans)))
            names = ", ".join(SPAN_COLUMNS)
            conn.execute(
                f"INSERT INTO spans ({names}, commit_seq) SELECT {names}, $seq FROM _new_spans",  # noqa: S608 - fixed names
                {"seq": seq},
            )
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
            conn.execute(
                "INSERT INTO kept_traces (trace_id, reason, weight, decided_ns, span_count, "
                "commit_seq) SELECT *, $seq FROM _new_kept",
                {"seq": seq},
            )
            conn.unregister("_new_kept")
        if steps:
            conn.register(
                "_new_steps",
                pa.table({f: [getattr(st, f) for st in steps] for f in EngineStep.__slots__}),
            )
            cols = ", ".join(EngineStep.__slots__)
            conn.execute(
                f"INSERT INTO engine_steps ({cols}, commit_seq) SELECT {cols}, $seq FROM _new_steps",  # noqa: S608 - dataclass field names
                {"seq": seq},
            )
            conn.unregister("_new_steps")
        if samples:
            conn.register("_new_gpu", pa.Table.from_pylist(samples))
            names = ", ".join(samples[0].keys())
            conn.execute(
                f"INSERT INTO gpu_samples ({names}, commit_seq) SELECT {names}, $seq FROM _new_gpu",  # noqa: S608 - fixed keys from the metrics decoder
                {"seq": seq},
            )
            conn.unregister("_new_gpu")
        return requests, spans, samples, steps, stored



def _log_commit(conn: duckdb.DuckDBPyConnection, seq: int, now_ns: int, wal_from: int | None) -> None:
    """Records the transaction `seq` in `commit_log`, in that transaction."""
    conn.execute("INSERT INTO commit_log VALUES (?, ?, ?)", [seq, now_ns, wal_from])


def last_commit_seq(conn: duckdb.DuckDBPyConnection) -> int:
    """Gives the newest `commit_log.seq` of the store (0: none)."""
    [(seq,)] = conn.execute("SELECT coalesce(max(seq), 0) FROM commit_log").fetchall()
    return int(seq)


def wal_checkpoint(conn: duckdb.DuckDBPyConnection) -> int | None:
    """Gives the first write-ahead-log record a restart must replay: the newest committed
    `wal_from` (None: no commit has set one; replay everything the log holds)."""
    rows = conn.execute(
        "SELECT wal_from FROM commit_log WHERE wal_from IS NOT NULL ORDER BY seq DESC LIMIT 1"
    ).fetchall()
    return int(rows[0][0]) if rows else None


def _write_trace_notes(conn: duckdb.DuckDBPyConnection, items: list[WriteBatch], seq: int) -> int:
    """Inserts the batches' engine starts and unmatched traces in the caller's transaction,
    one row a trace: not those of re-sent traces the store holds already (the first copy
    wins, as `stored.StoredRows` has it for the other tables); gives the rows inserted."""
    recheck = set().union(*(b.recheck for b in items))
    tables: tuple[tuple[str, list[dict[str, Any]]], ...] = (
        ("engine_starts", [
            {"trace_id": e.trace_id, "service": e.service, "instance": e.instance,
             "start_ns": e.start_ns, "end_ns": e.end_ns, "phases": e.phases_json()}
            for b in items for e in b.engine_starts
        ]),
        ("unmatched_traces", [asdict(u) for b in items for u in b.unmatched]),
    )  # fmt: skip
    written = 0
    for table, rows in tables:
        again = [r["trace_id"] for r in rows if r["trace_id"] in recheck]
        stored: set[str] = set()
        if again:
            conn.register("_again", pa.table({"trace_id": again}))
            sql = f"SELECT DISTINCT trace_id FROM {table} SEMI JOIN _again USING (trace_id)"  # noqa: S608 - fixed names
            stored = {t for (t,) in conn.execute(sql).fetchall()}
            conn.unregister("_again")
        new: dict[str, dict[str, Any]] = {}
        for r in rows:
            if r["trace_id"] not in stored:
                new.setdefault(r["trace_id"], r)
        if not new:
            continue
        conn.register("_new_notes", pa.Table.from_pylist(list(new.values())))
        names = ", ".join(next(iter(new.values())))
        conn.execute(
            f"INSERT INTO {table} ({names}, commit_seq) SELECT {names}, $seq FROM _new_notes",  # noqa: S608 - fixed names
            {"seq": seq},
        )
        conn.unregister("_new_notes")
        written += len(new)
    return written
