"""Cold-start marking: the first requests after process start or a long idle gap."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tokentrace.instrumentation._runtime import State, runtime


class ColdStartTracker:
    """Says whether a request starting now is a cold start.

    A request is cold when it is one of the first `requests` after the process
    started, or after `idle_s` seconds without any request starting.  The clock
    is injected so tests control time.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._last: float | None = None
        self._cold_left: int | None = None  # None: not started yet

    def observe(self, requests: int, idle_s: float) -> bool:
        """Counts one request starting now; gives True when it is a cold start."""
        now = self._clock()
        last = self._last
        if self._cold_left == 0 and last is not None and now - last < idle_s:
            self._last = now  # warm: the common case needs no lock
            return False
        with self._lock:
            if self._cold_left is None or (self._last is not None and now - self._last >= idle_s):
                self._cold_left = requests
            self._last = now
            if self._cold_left > 0:
                self._cold_left -= 1
                return True
            return False

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (another thread may have held it at the
        fork), and the child's first requests are cold starts."""
        self._lock = threading.Lock()
        self._last = None
        self._cold_left = None

    def reset(self) -> None:
        """Forgets history: the next requests are cold again (as after a restart)."""
        with self._lock:
            self._last = None
            self._cold_left = None


tracker = ColdStartTracker()


def _after_fork_in_child() -> None:
    if runtime.state is State.FORKED:
        # a new instance, configured again on first use: its first requests are cold starts
        tracker.after_fork()
    else:
        # the parent's configuration goes on (the host's own provider), and so does its
        # history; the lock is made again whatever the configuration
        tracker._lock = threading.Lock()


runtime.on_fork_in_child(_after_fork_in_child)
