"""Backpressure in the log: one line when the receivers start refusing exports,
one when they take them again.

Under backpressure every export is answered 503 / UNAVAILABLE and its sender
retries, so a line per refusal would flood the log at the rate of the flood.
An SRE needs to know that it began, which bound was reached (the tail buffer,
`max_buffered_spans`, or the writer queue, `max_pending_writes`), when it ended
and how much was turned away meanwhile; /metrics
(`tokentrace_exports_refused_total`) has the running count.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

logger = logging.getLogger("tokentrace.collector")


class RefusalEpisodes:
    """Logs a WARNING at the first refused export of an episode (naming the bound,
    from `describe(reason)`) and one at the next accepted export (how long it
    lasted, how many exports were refused, by reason).  Thread-safe; an accepted
    export outside an episode costs one attribute read."""

    def __init__(self, describe: Callable[[str], str], clock: Callable[[], float] = time.monotonic) -> None:
        self._describe = describe
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # when the episode under way began
        self._refused: Counter[str] = Counter()

    @property
    def refusing(self) -> bool:
        """Whether an episode is under way (the last export was refused)."""
        return self._since is not None

    def note(self, why: str | None) -> None:
        """Records one export's outcome: refused for `why`, or accepted (None)."""
        if why is not None:
            self._refused_one(why)
        elif self._since is not None:
            self._end()

    def _refused_one(self, why: str) -> None:
        # the lines are written under the lock, so an episode's end is never
        # logged before its start by a receiver thread that got there first
        with self._lock:
            self._refused[why] += 1
            if self._since is not None:
                return
            self._since = self._clock()
            logger.warning(
                "tokentrace: refusing exports (HTTP 503, gRPC UNAVAILABLE; senders retry): %s",
                self._describe(why),
            )

    def _end(self) -> None:
        with self._lock:
            if self._since is None:  # another receiver thread ended it
                return
            lasted = self._clock() - self._since
            refused, self._refused = self._refused, Counter()
            self._since = None
            # a WARNING as its start is (the writer's "takes writes again" alike): `serve`
            # logs WARNINGs only unless -v, and a start seen without its end reads as a
            # collector stuck refusing, which tempts a restart that loses the tail buffer
            logger.warning(
                "tokentrace: taking exports again after %.1f s; %d exports were refused meanwhile (%s)",
                lasted,
                sum(refused.values()),
                ", ".join(f"{why} {n}" for why, n in refused.most_common()),
            )
