"""The shard's lake mover (`serve --lake`): a thread that moves sealed rows into the lake.

Every `lake_move_interval_s` it moves the local commits the lake does not hold yet, oldest
first, up to `MAX_MOVE_ROWS` rows a move, each move one lake transaction with its ledger row
(`collector/lake_moves.py`: why a batch is never stored twice).  It works on its own cursor
of the write connection: the lake is attached to that DuckDB instance, so the cursor reads
`main.*` and writes `lake.*`; the writer thread only appends to `main`, so the two never
conflict (collector/retention.py says why, for DuckDB's MVCC).

The lake unreachable (PostgreSQL down, the data path unwritable): the shard keeps taking
exports into its local file, the mover retries with a backoff (`RETRY_FIRST_S` doubled up to
`RETRY_MAX_S`), attaching the lake anew, and catches up in several moves once it is back.
`/readyz` says so while the shard is within its bound; beyond `lake_max_unmoved_rows`
unmoved rows the receivers answer 503 with Retry-After (`refusals.REFUSED_LAKE_BEHIND`)
until the lake takes them.  Local rows are deleted only once moved (`collector/retention.py`).

Small files: see `collector/lake_upkeep.py` (inlining, compaction, expiry, with figures).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

import duckdb

from tokentrace.collector.lake_moves import (
    MAX_MOVE_ROWS,
    Moved,
    move_once,
    moved_through,
    unmoved_rows,
)
from tokentrace.collector.lake_upkeep import UPKEEP_INTERVAL_S, run_upkeep, set_inlining
from tokentrace.store.errors import StoreError
from tokentrace.store.lake.catalog import ALIAS, attach, describe, is_conflict, retrying

logger = logging.getLogger("tokentrace.collector")

#: Backoff between attempts while the lake fails: first, then doubled up to the last.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0
#: How long `close()` tries its last moves (a restart moves the rest).
CLOSE_TIMEOUT_S = 10.0


class RowsWritten(Protocol):
    @property
    def rows_written(self) -> int: ...


class LakeMover:
    """Moves this shard's committed rows into the lake attached to `conn`, on a thread."""

    def __init__(
        self,
        conn: duckdb.DuckDBPyConnection,
        uri: str,
        data_path: str | None,
        shard: str,
        *,
        interval_s: float,
        max_unmoved_rows: int,
        writer: RowsWritten | None = None,
        move_rows: int = MAX_MOVE_ROWS,
        upkeep_interval_s: float = UPKEEP_INTERVAL_S,
        clock: Callable[[], int] = time.time_ns,
        before_commit: Callable[[], None] | None = None,
        after_commit: Callable[[Moved], None] | None = None,
    ) -> None:
        self.uri = uri
        self.data_path = data_path
        self.shard = shard
        self.interval_s = interval_s
        self.max_unmoved_rows = max_unmoved_rows
        self.move_rows = move_rows
        self.upkeep_interval_s = upkeep_interval_s
        self._conn = conn
        self._cur = conn.cursor()
        self._writer = writer
        self._clock = clock
        self._before_commit = before_commit
        self._after_commit = after_commit
        self._attached = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one move at a time: the thread's, close()'s, a test's
        self._next_upkeep = time.monotonic() + upkeep_interval_s
        #: the newest local commit the lake holds (-1: none; None: not read yet)
        self.moved_seq: int | None = None
        self.rows_moved_total = 0
        self.moves_total = 0
        self.moves_failed_total = 0
        #: unix seconds of the last move that committed or found nothing to move
        self.last_move_s: float | None = None
        self.last_move_seconds: float | None = None
        #: why the last attempt failed (None: it succeeded)
        self.error: str | None = None
        self._failing_since = 0.0
        self._unmoved_base = 0
        self._written_at_base = self._rows_written()

    # ---- state read by /metrics, /readyz and the receivers ---------------------------
    @property
    def reachable(self) -> bool:
        return self.error is None

    @property
    def unmoved_rows(self) -> int:
        """Local rows the lake does not hold: counted at the last attempt, plus those the
        writer committed since (cheap: the receivers read it for every export)."""
        return self._unmoved_base + max(0, self._rows_written() - self._written_at_base)

    def behind(self) -> bool:
        """Whether the receivers must refuse exports: more unmoved rows than the bound."""
        return self.unmoved_rows > self.max_unmoved_rows

    def condition(self) -> str | None:
        """Gives what /readyz says of the lake, None while moves succeed."""
        if self.error is None:
            return None
        return (
            f"lake unreachable for {time.monotonic() - self._failing_since:.0f} s ({self.error}); "
            f"{self.unmoved_rows} rows unmoved of lake_max_unmoved_rows {self.max_unmoved_rows}"
        )

    def _rows_written(self) -> int:
        return self._writer.rows_written if self._writer is not None else 0

    # ---- moving ------------------------------------------------------------------------
    def attach(self) -> None:
        """Attaches the lake (making its tables) if it is not; raises StoreError if it cannot."""
        if self._attached:
            return
        attach(self._cur, self.uri, self.data_path)
        retrying(lambda: set_inlining(self._cur))
        self._attached = True

    def _detach(self) -> None:
        # a broken catalog connection is not always mended by the extension: attach anew
        self._attached = False
        try:
            self._cur.execute(f"DETACH DATABASE IF EXISTS {ALIAS}")
        except duckdb.Error:
            logger.debug("tokentrace lake: detach after a failure failed", exc_info=True)

    def move_now(self) -> Moved | None:
        """Moves the oldest unmoved commits once (attaching the lake first if needed); gives
        what moved, None when nothing was left.  Raises the lake's error (counted, noted)."""
        with self._lock:
            written = self._rows_written()
            t0 = time.perf_counter()
            try:
                self.attach()
                moved = retrying(lambda: move_once(
                    self._cur, self.shard, cap=self.move_rows, clock=self._clock,
                    before_commit=self._before_commit,
                ))  # fmt: skip
            except (duckdb.Error, StoreError) as exc:
                self._failed(exc)
                self._count_unmoved()
                raise
            self._succeeded(moved, written, time.perf_counter() - t0)
        if moved is not None and self._after_commit is not None:
            self._after_commit(moved)
        return moved

    def _count_unmoved(self) -> None:
        """Counts the local rows after the newest commit known to be in the lake (the lake
        unreachable: what the local file alone can tell)."""
        written = self._rows_written()
        try:
            self._unmoved_base = unmoved_rows(
                self._cur, self.moved_seq if self.moved_seq is not None else -1
            )
            self._written_at_base = written
        except duckdb.Error:
            logger.debug("tokentrace lake: counting unmoved rows failed", exc_info=True)

    def _succeeded(self, moved: Moved | None, written: int, seconds: float) -> None:
        # `written`: the writer's count before the move read the local rows; rows committed
        # since are unmoved, on top of those the move left
        self._written_at_base = written
        if moved is not None:
            self.moved_seq = moved.last_seq
            self.rows_moved_total += moved.rows
            self.moves_total += 1
            self._unmoved_base = moved.left
            self.last_move_seconds = seconds
        else:
            self.moved_seq = moved_through(self._cur, self.shard)
            self._unmoved_base = 0
        self.last_move_s = self._clock() / 1e9
        if self.error is not None:
            logger.warning(
                "tokentrace lake: moves succeed again after %.1f s; %d rows left to move",
                time.monotonic() - self._failing_since, self.unmoved_rows,
            )  # fmt: skip
        self.error = None

    def _failed(self, exc: BaseException) -> None:
        self.moves_failed_total += 1
        reason = describe(
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        )
        if self.error is None:
            self._failing_since = time.monotonic()
            logger.error(
                "tokentrace lake: a move into %s failed (%s); the shard keeps taking exports into "
                "its local file and retries every %.0f-%.0f s",
                describe(self.uri), reason, RETRY_FIRST_S, RETRY_MAX_S,
            )  # fmt: skip
        self.error = reason
        if not is_conflict(exc):
            self._detach()

    # ---- the thread ------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="tokentrace-lake-mover", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        delay = RETRY_FIRST_S
        while not self._stop.is_set():
            wait = self.interval_s
            try:
                moved = self.move_now()
                delay = RETRY_FIRST_S
                if moved is not None and moved.left:
                    wait = 0.0  # behind: the next move at once
                elif time.monotonic() >= self._next_upkeep:
                    self._upkeep()
            except (duckdb.Error, StoreError):
                wait, delay = delay, min(delay * 2, RETRY_MAX_S)
            except Exception:  # a bug: say so, keep moving
                logger.exception(
                    "tokentrace lake: the mover hit an unexpected error; it keeps running"
                )
                wait = self.interval_s
            self._stop.wait(wait)

    def _upkeep(self) -> None:
        self._next_upkeep = time.monotonic() + self.upkeep_interval_s
        t0 = time.perf_counter()
        try:
            with self._lock:
                skipped = run_upkeep(self._cur)
        except duckdb.Error as exc:
            logger.warning(
                "tokentrace lake: upkeep (compaction, expiry) failed: %s; next turn", exc
            )
            return
        logger.info(
            "tokentrace lake: upkeep took %.2f s (skipped: %s)",
            time.perf_counter() - t0,
            skipped or "none",
        )

    def stop(self) -> None:
        """Stops the thread (a move under way finishes first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(CLOSE_TIMEOUT_S + 60.0)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Stops the thread, then moves what is left for at most `timeout` seconds (a move
        still running then is interrupted and rolled back: a restart moves it); runs once."""
        if self._cur is None:
            return
        self.stop()
        deadline = time.monotonic() + timeout
        interrupter = threading.Timer(timeout, self._cur.interrupt)
        interrupter.daemon = True
        interrupter.start()
        try:
            while time.monotonic() < deadline:
                moved = self.move_now()
                if moved is None or not moved.left:
                    break
        except (duckdb.Error, StoreError) as exc:
            logger.warning(
                "tokentrace lake: the last move at shutdown failed (%s); %d rows stay in the "
                "local file and move at the next start", exc, self.unmoved_rows,
            )  # fmt: skip
        finally:
            interrupter.cancel()
        self._cur.close()
        self._cur = None  # type: ignore[assignment]
