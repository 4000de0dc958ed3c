"""Refusals: why an export is turned away, what its sender and /readyz are told, and
backpressure in the log (one line when the receivers start refusing exports, one when
they take them again).

`Pipeline.offer()` refuses an export, whole, when the tail buffer or the writer queue
is full; the receivers answer 503 (gRPC UNAVAILABLE) with Retry-After.  Under
backpressure every export is refused and its sender retries, so a line per refusal
would flood the log at the rate of the flood.  An SRE needs to know that it began,
which bound was reached (the tail buffer, `max_buffered_spans` or
`max_buffered_bytes`, or the writer queue, `max_pending_writes`), when it ended and
how much was turned away meanwhile; /metrics (`tokentrace_exports_refused_total`)
has the running count.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tokentrace.collector.trace_buffer import TraceBuffer
    from tokentrace.collector.writer import Writer

logger = logging.getLogger("tokentrace.collector")

#: Why `Pipeline.offer()` refused an export (also the `reason` label of rejected spans).
REFUSED_BUFFER_FULL = "buffer_full"
REFUSED_WRITER_BEHIND = "writer_behind"
#: a shard of a lake holds more rows the lake has not taken than `lake_max_unmoved_rows`
REFUSED_LAKE_BEHIND = "lake_behind"


class LakeGate(Protocol):
    """What the receivers ask of a shard's lake mover (`collector/lake_mover.py`)."""

    max_unmoved_rows: int

    @property
    def unmoved_rows(self) -> int: ...

    def behind(self) -> bool: ...

    def condition(self) -> str | None: ...


def _mib(nbytes: float) -> str:
    return f"{nbytes / (1024 * 1024):.0f}"


def refusal_message(why: str, store_error: str | None) -> str:
    """Gives the message of a 503/UNAVAILABLE for the refusal reason `why`; `store_error`:
    why the store takes no writes, if it does not."""
    text = why.replace("_", " ")
    if why == REFUSED_WRITER_BEHIND and store_error is not None:
        text += f": the store takes no writes ({store_error})"
    if why == REFUSED_LAKE_BEHIND:
        text += ": too many rows wait for the lake"
    return text + "; retry later"


def unready_reason(writer: Writer, buffer: TraceBuffer) -> str | None:
    """Gives why receivers would refuse an export now (`/readyz`), None when ready."""
    error = writer.store_error
    if error is not None:
        return (
            f"store not writable for {writer.failing_for_seconds:.0f} s ({error}); "
            f"{writer.pending} batches waiting"
        )
    if writer.pending >= writer.capacity:
        return f"writer queue full ({writer.pending} of {writer.capacity} batches)"
    if buffer.spans >= buffer.max_spans:
        return f"tail buffer full ({buffer.spans} of {buffer.max_spans} spans)"
    if buffer.bytes >= buffer.max_bytes:
        return f"tail buffer full ({_mib(buffer.bytes)} of {_mib(buffer.max_bytes)} MiB)"
    return None


def lake_unready(lake: LakeGate) -> str:
    """Gives why a shard beyond its unmoved-rows bound refuses exports (/readyz, the log)."""
    return "too many rows wait for the lake: " + (
        lake.condition()
        or f"{lake.unmoved_rows} rows unmoved of lake_max_unmoved_rows {lake.max_unmoved_rows}"
        " (the lake takes rows slower than they come)"
    )


def bound_reached(why: str, writer: Writer, buffer: TraceBuffer, lake: LakeGate | None = None) -> str:
    """Gives the bound behind the refusal reason `why`, with its figures (for the log)."""
    if why == REFUSED_LAKE_BEHIND and lake is not None:
        return lake_unready(lake)
    if why == REFUSED_BUFFER_FULL:
        if buffer.full_of_bytes:
            return (
                f"the tail buffer is full ({_mib(buffer.bytes)} MiB buffered in {buffer.spans} "
                f"spans, max_buffered_bytes {_mib(buffer.max_bytes)} MiB)"
            )
        return f"the tail buffer is full ({buffer.spans} spans buffered, max_buffered_spans {buffer.max_spans})"
    error = writer.store_error
    if error is not None:
        return (
            f"the store takes no writes ({error}); {writer.pending} batches wait "
            f"(max_pending_writes {writer.capacity})"
        )
    return f"the writer queue is full ({writer.pending} batches, max_pending_writes {writer.capacity})"


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
