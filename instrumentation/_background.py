"""A bounded queue drained by a daemon thread: the SDK's work off the host's threads.

The host's threads only append; building OpenTelemetry spans (attribute
checks, id generation, locks: ~10 µs a span) happens on a daemon thread that
wakes every `interval_s`, or early once `wake_at` items wait.  Subclasses say
what a batch becomes in `flush`.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from typing import Generic, TypeVar

from tokentrace.instrumentation._runtime import runtime
from tokentrace.instrumentation._safety import log_once

_T = TypeVar("_T")


def yield_gil() -> None:
    """Hands the GIL to a thread waiting for it (a serving loop back from a GIL-free
    forward would otherwise wait for a flusher's whole batch, up to the 5 ms switch
    interval at a time): sleeping releases it."""
    time.sleep(0)


#: a flusher hands the GIL over after this much of its work (about one 64-token request's
#: spans), not after every item: a host busy in Python keeps the GIL it is handed for a
#: whole switch interval (5 ms), so a yield per item capped a flusher of small requests
#: at ~200 a second while the host finished more, and its queue grew without bound
YIELD_EVERY_NS = 500_000

_perf_ns = time.perf_counter_ns


_live: weakref.WeakSet[QueueFlusher[object]] = weakref.WeakSet()


class QueueFlusher(Generic[_T]):
    """A bounded deque of pending items and the daemon thread that flushes it."""

    def __init__(
        self,
        name: str,
        interval_s: float,
        max_pending: int,
        wake_at: int,
        drop_oldest: bool = False,
        catch_up_at: int | None = None,
    ) -> None:
        self._name = name
        #: from this many waiting items on, the flusher keeps the GIL (`_yield_gil`)
        self._catch_up_at = 4 * wake_at if catch_up_at is None else catch_up_at
        self._yield_at = 0
        self._drop_oldest = drop_oldest
        #: items dropped from a full queue (with `drop_oldest`), not yet reported
        self.dropped = 0
        self._items: deque[_T] = deque()
        self._max_pending = max_pending
        self._wake_at = wake_at
        self._interval = interval_s
        self._wake = threading.Event()
        self._flush_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        _live.add(self)  # type: ignore[arg-type]

    # ---- hot path ---------------------------------------------------------
    def offer(self, item: _T) -> bool:
        """Queues `item` for the flusher.

        On a full queue either the oldest item is dropped (and counted), or,
        without `drop_oldest`, nothing is queued and False says the caller
        must deal with `item` itself.
        """
        items = self._items
        if len(items) >= self._max_pending:
            if not self._drop_oldest:
                return False
            items.popleft()
            self.dropped += 1
        items.append(item)
        if self._thread is None:
            self._start()
        elif len(items) == self._wake_at:
            # once, on crossing: setting an Event takes a lock, too dear per item
            # when the flusher lags; the interval catches anything left above
            self._wake.set()
        return True

    # ---- flusher ----------------------------------------------------------
    def flush(self, final: bool = True) -> int:
        """Turns what is queued into spans; gives how many items went."""
        raise NotImplementedError

    def _yield_gil(self) -> None:
        """Between two items of a flush that is not the last: hands the GIL to the
        host (`yield_gil`) once `YIELD_EVERY_NS` of flushing have passed since the last
        time — unless `catch_up_at` items wait: the host then makes work faster than
        a flusher that keeps yielding builds it, and the flusher catches up, handing
        the GIL over at Python's switch interval like any thread."""
        if len(self._items) >= self._catch_up_at:
            return
        if _perf_ns() >= self._yield_at:
            yield_gil()
            self._yield_at = _perf_ns() + YIELD_EVERY_NS

    def _start(self) -> None:
        with self._thread_lock:
            if self._thread is not None:
                return
            t = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread = t
            t.start()
        # once a queue and process (a forked child starts its own thread): the thread
        # is a daemon, so exit builds and exports what waits, configured or not
        runtime.register_exit_flush(_work_waits)

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            try:
                self.flush(final=False)
            except Exception as exc:  # the SDK's own failure must never reach the host
                log_once(f"{self._name} flush", exc)

    def _after_fork(self) -> None:
        # the child has no flusher thread and must not send the parent's items twice
        self._thread = None
        self._items.clear()
        self.dropped = 0  # the parent's to report
        self._wake = threading.Event()
        self._flush_lock = threading.Lock()
        self._thread_lock = threading.Lock()


def _work_waits() -> bool:
    """Whether any queue holds items (what exit must still build and export)."""
    return any(flusher._items for flusher in list(_live))


def _reset_all_after_fork() -> None:
    for flusher in list(_live):
        flusher._after_fork()


runtime.on_fork_in_child(_reset_all_after_fork)
