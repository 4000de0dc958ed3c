"""Cold-start marking: the first requests after process start or a long idle gap."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable


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


def _new_lock_after_fork() -> None:
    # whether the child's first requests are cold starts is `_config`'s to say
    # (`tracker.after_fork()`); the lock is remade whatever the configuration
    tracker._lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_new_lock_after_fork)
