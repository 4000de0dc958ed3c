"""The diagnosis report, computed off the request path and reused while fresh.

`build_report` reads every request of the window and runs each diagnosis
signal: seconds on millions of requests.  Pages ask this cache instead: a
fresh report is returned at once, a stale one is returned while a single
worker thread recomputes it (stale-while-revalidate), and a missing one is
waited for up to the caller's budget.  Reports are keyed by the *unresolved*
page filters ("last 1h"), so new requests arriving do not defeat the cache.

Distinct computations waiting for the worker are bounded (MAX_PENDING, the running
one included): a flood of distinct filters gets `ReportsBusy` (503, Retry-After)
instead of a queue of reports that takes hours.  Pages wait with `wait` (async: a
waiting request holds no thread of the server's pool, which other pages need).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from tokentrace.analyzer.report import build_report
from tokentrace.store.reader import StoreReader
from tokentrace.store.snapshot import one_snapshot
from tokentrace.web._db import time_limit
from tokentrace.web._params import ViewFilters

#: A report younger than this is served without recomputing.
FRESH_S = 15.0
#: A report older than this is not served at all (callers wait or go without).
MAX_AGE_S = 600.0
#: The background computation's own time limit: longer than a page query's.
REPORT_TIME_LIMIT_S = 300.0
MAX_ENTRIES = 64
#: Most distinct reports computing or queued at once (one runs, the others wait their turn).
MAX_PENDING = 5
#: What a refusal asks the client to wait before retrying (the Retry-After header), seconds.
RETRY_AFTER_S = 10


class ReportsBusy(RuntimeError):
    """MAX_PENDING distinct reports are already being computed: this one is not queued."""

    def __init__(self) -> None:
        super().__init__(
            f"busy computing other diagnoses ({MAX_PENDING} at most at a time); "
            f"retry in {RETRY_AFTER_S} s or so"
        )


@dataclass(slots=True)
class CachedReport:
    report: dict[str, Any]
    computed_at: float  # clock seconds
    compute_s: float

    @property
    def services(self) -> int:
        """How many services the window's requests come from (findings over several mix them)."""
        return int(self.report.get("requests", {}).get("services") or 0)


class ReportCache:
    """Hands out the report of a filter set: fresh, stale-while-refreshing, or after waiting."""

    def __init__(self, db: StoreReader, clock: Callable[[], float] = time.monotonic) -> None:
        self._db = db
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[ViewFilters, CachedReport] = OrderedDict()
        self._pending: dict[ViewFilters, Future[CachedReport]] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokentrace-report")

    def age_s(self, entry: CachedReport) -> float:
        """Gives how many seconds ago `entry` was computed (pages say it: a served report may be stale)."""
        return max(0.0, self._clock() - entry.computed_at)

    def _compute(self, view: ViewFilters) -> CachedReport:
        from tokentrace.web._overview import newest_start_ns

        started = self._clock()
        try:
            # one snapshot: the report's figures agree, and a lake's catalog is read once
            with self._db.cursor() as cur, time_limit(cur, REPORT_TIME_LIMIT_S), one_snapshot(cur):
                report = build_report(cur, view.resolve(newest_start_ns(cur)))
            entry = CachedReport(report, self._clock(), self._clock() - started)
            with self._lock:
                self._entries[view] = entry
                self._entries.move_to_end(view)
                while len(self._entries) > MAX_ENTRIES:
                    self._entries.popitem(last=False)
            return entry
        finally:
            with self._lock:
                self._pending.pop(view, None)

    def _refresh(self, view: ViewFilters) -> Future[CachedReport]:
        """Gives the computation of `view`'s report, started or queued now if need be;
        raises ReportsBusy when MAX_PENDING others are pending."""
        with self._lock:
            fut = self._pending.get(view)
            if fut is None:
                if len(self._pending) >= MAX_PENDING:
                    raise ReportsBusy()
                fut = self._pending[view] = self._pool.submit(self._compute, view)
            return fut

    def lookup(
        self, view: ViewFilters
    ) -> tuple[CachedReport | None, bool, Future[CachedReport] | None]:
        """Gives (usable report or None, whether a newer one is being computed, the computation
        to wait for when there is no usable report); raises ReportsBusy when there is none and
        MAX_PENDING other reports are pending."""
        with self._lock:
            entry = self._entries.get(view)
        age = None if entry is None else self._clock() - entry.computed_at
        if entry is not None and age is not None and age < FRESH_S:
            return entry, False, None
        stale = entry if entry is not None and age is not None and age < MAX_AGE_S else None
        try:
            fut = self._refresh(view)
        except ReportsBusy:
            if stale is None:
                raise
            return stale, False, None  # not refreshed now: a later look will
        if stale is not None:
            return stale, True, None
        return None, True, fut

    def get(self, view: ViewFilters, wait_s: float) -> tuple[CachedReport | None, bool]:
        """Gives (report or None, whether a newer one is being computed); blocks at most `wait_s`
        (only for short waits: a blocked thread is one fewer for other pages)."""
        entry, refreshing, fut = self.lookup(view)
        if fut is None:
            return entry, refreshing
        try:
            return fut.result(timeout=wait_s), False
        except FutureTimeout:
            return None, True

    async def wait(self, view: ViewFilters, wait_s: float) -> tuple[CachedReport | None, bool]:
        """Like `get`, but waits on the event loop, holding no thread while the report computes."""
        entry, refreshing, fut = self.lookup(view)
        if fut is None:
            return entry, refreshing
        waiting = asyncio.wrap_future(fut)
        # asyncio.wait, not wait_for: a timeout must not cancel the computation others wait for
        done, _ = await asyncio.wait({waiting}, timeout=wait_s)
        if not done:
            waiting.add_done_callback(_consume)
            return None, True
        return waiting.result(), False

    def close(self, wait: bool = False) -> None:
        """Stops computing reports; `wait` also waits for one that is running (before closing its database)."""
        self._pool.shutdown(wait=wait, cancel_futures=True)


def _consume(fut: asyncio.Future[CachedReport]) -> None:
    """Reads the outcome of a computation nobody waits for any more (no 'never retrieved' noise)."""
    if not fut.cancelled():
        fut.exception()
