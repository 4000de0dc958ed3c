"""Span export that never holds the host up: a circuit breaker, a deadline, bounded waits.

OpenTelemetry's `BatchSpanProcessor` exports every queued batch at flush and at
shutdown, each waiting the exporter's timeout (and its retries with backoff)
while the collector is down, and joins its worker for up to 30 s at shutdown:
`tt.shutdown()`, interpreter exit or a second `configure()` took half a minute
with a collector that accepts and never answers.  Here:

* `GuardedExporter` wraps the OTLP exporter: after a failed export it drops
  what comes (counted, logged once an outage) and tries again after
  `RETRY_AFTER_S`, doubling up to `MAX_RETRY_AFTER_S`; once shutdown began it
  exports until a deadline or the first failure, then drops the rest at once.
  Over OTLP/HTTP a connection error is not retried after backoff (only the
  exporter's immediate retry of a stale pooled connection is left).
* `CountingBatchSpanProcessor` is OpenTelemetry's batch span processor, which
  drops a span when its queue is full (a collector slower than spans end): it
  counts those in the guard's `dropped` and logs them like an outage (when the
  queue first overflows, and the count once the collector keeps up again).
* `run_bounded` runs a shutdown on a daemon thread and waits at most its timeout:
  the caller never waits on the collector longer than that.  `SingleFlight` does
  the same for flushes, one at a time: a flush stuck on a slow collector is
  joined by the next callers, never doubled by a thread each.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from tokentrace.instrumentation._safety import log_once, logger

#: the OTLP exporter's timeout for one export, retries included (OpenTelemetry's default is 10 s)
EXPORT_TIMEOUT_S = 3.0
#: the most `tt.shutdown()`, interpreter exit or a replaced configuration wait on the collector
SHUTDOWN_TIMEOUT_S = 5.0
#: after a failed export, spans are dropped this long before the next try (doubling up to the max)
RETRY_AFTER_S = 5.0
MAX_RETRY_AFTER_S = 30.0


class Breaker:
    """A circuit breaker: closed until a failure, then open for a cool-down that
    doubles with each failure in a row (up to `MAX_RETRY_AFTER_S`); the first call
    after it is the next try.  Thread-safe; `clock` is monotonic seconds."""

    def __init__(
        self,
        retry_after_s: float = RETRY_AFTER_S,
        max_retry_after_s: float = MAX_RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.retry_after_s = retry_after_s
        self.max_retry_after_s = max_retry_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._open_until = 0.0
        #: failures in a row (0: the last try went through)
        self.failures = 0

    def allow(self) -> bool:
        """Gives whether to try now (closed, or its cool-down is over)."""
        return self._clock() >= self._open_until

    @property
    def is_open(self) -> bool:
        return self.failures > 0

    def failed(self) -> float:
        """Opens the breaker; gives the seconds until the next try."""
        with self._lock:
            self.failures += 1
            wait = min(self.max_retry_after_s, self.retry_after_s * 2 ** (self.failures - 1))
            self._open_until = self._clock() + wait
            return wait

    def succeeded(self) -> bool:
        """Closes the breaker; gives whether it was open."""
        with self._lock:
            was_open, self.failures, self._open_until = self.failures > 0, 0, 0.0
            return was_open


class Unreachable(Exception):
    """A connection error the OTLP exporter must not retry after backoff."""


class GuardedExporter(SpanExporter):
    """Wraps a span exporter so that a dead or silent collector costs dropped
    spans, never time: see the module's docstring."""

    def __init__(
        self,
        inner: SpanExporter | None,
        endpoint: str,
        *,
        breaker: Breaker | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: set after construction when the exporter's session needs this guard
        self.inner: SpanExporter | None = inner
        self.endpoint = endpoint
        self.breaker = breaker or Breaker(clock=clock)
        self._clock = clock
        self._lock = threading.Lock()
        #: set once shutdown began: exports start until then, and none after a failure
        self._deadline: float | None = None
        self._inner_shut = False
        #: attempts in the export under way (the exporter's session counts them)
        self.attempts = 0
        #: spans dropped in all (failed exports, an outage, a full span queue), and
        #: since the outage or the overflow under way began
        self.dropped = 0
        self._dropped_in_outage = 0
        #: spans the batch processor dropped because its queue was full (in `dropped` too)
        self.queue_full_dropped = 0
        #: set from the first span a full queue dropped until an export ends without one
        self._overflowing = False

    # -- SpanExporter ----------------------------------------------------------

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        inner = self.inner
        deadline = self._deadline
        if (
            inner is None
            or self._inner_shut
            or (deadline is not None and (self._clock() >= deadline or self.breaker.is_open))
            or not self.breaker.allow()
        ):
            self._drop(len(spans))
            return SpanExportResult.FAILURE
        self.attempts = 0
        queue_full_before = self.queue_full_dropped
        try:
            result = inner.export(spans)
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("span export", exc)
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            if self.breaker.succeeded():
                with self._lock:
                    dropped, self._dropped_in_outage = self._dropped_in_outage, 0
                    self._overflowing = False
                logger.warning(
                    "tokentrace: the collector at %s takes spans again; %d spans were dropped "
                    "while it did not",
                    self.endpoint,
                    dropped,
                )
            elif self._overflowing:
                self._caught_up(queue_full_before)
            return result
        first = not self.breaker.is_open
        wait = self.breaker.failed()
        self._drop(len(spans))
        if first:
            logger.warning(
                "tokentrace: export to the collector at %s failed: spans are dropped "
                "(nothing waits on it) and export is tried again in %.0f s, then less often "
                "while it fails; the count is logged when it answers again",
                self.endpoint,
                wait,
            )
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self._shutdown_inner()
        with self._lock:
            dropped, self._dropped_in_outage = self._dropped_in_outage, 0
            behind, self._overflowing = self._overflowing and not self.breaker.is_open, False
        if dropped:
            logger.warning(
                "tokentrace: shut down with the collector at %s %s: %d spans dropped",
                self.endpoint,
                "behind (the span queue was full)" if behind else "unreachable",
                dropped,
            )

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        inner = self.inner
        return True if inner is None else bool(inner.force_flush(timeout_millis))

    # -- shutdown ---------------------------------------------------------------

    def begin_shutdown(self, deadline: float) -> None:
        """From now on exports start until `deadline` (`clock` seconds) and stop at the
        first failure: a healthy collector still gets everything queued."""
        with self._lock:
            if self._deadline is None or deadline < self._deadline:
                self._deadline = deadline

    def abort(self) -> None:
        """Ends the export under way as soon as the exporter allows (its retry wait)."""
        with self._lock:
            self._deadline = float("-inf")
        self._shutdown_inner()

    def _shutdown_inner(self) -> None:
        with self._lock:
            inner, already = self.inner, self._inner_shut
            self._inner_shut = True
        if inner is not None and not already:
            try:
                inner.shutdown()
            except Exception as exc:
                log_once("span exporter shutdown", exc)

    def _drop(self, count: int) -> None:
        with self._lock:
            self.dropped += count
            self._dropped_in_outage += count

    # -- a full span queue ------------------------------------------------------

    def queue_full(self, queue_size: int, count: int = 1) -> None:
        """Counts `count` spans the batch processor dropped, its queue of `queue_size`
        being full: the collector takes spans slower than they end.  Logged when the
        queue first overflows; the count is logged once the collector keeps up again."""
        with self._lock:
            self.dropped += count
            self._dropped_in_outage += count
            self.queue_full_dropped += count
            first, self._overflowing = not self._overflowing, True
        if first and not self.breaker.is_open:  # an outage under way says it already
            logger.warning(
                "tokentrace: the span queue is full (%d spans): the collector at %s takes "
                "spans slower than they end; spans are dropped (nothing waits on it); the "
                "count is logged when it keeps up again",
                queue_size,
                self.endpoint,
            )

    def _caught_up(self, queue_full_before: int) -> None:
        """After an export that went through: when the full queue dropped nothing while
        it ran, the collector keeps up again; says how many spans were dropped."""
        with self._lock:
            if not self._overflowing or self.queue_full_dropped != queue_full_before:
                return
            dropped, self._dropped_in_outage = self._dropped_in_outage, 0
            self._overflowing = False
        logger.warning(
            "tokentrace: the collector at %s keeps up again; %d spans were dropped while "
            "the span queue was full",
            self.endpoint,
            dropped,
        )


class CountingBatchSpanProcessor(BatchSpanProcessor):
    """OpenTelemetry's `BatchSpanProcessor`, counting the spans its full queue drops.

    Its queue is a `deque(maxlen=...)`: a span ended while it is full pushes the
    oldest one out, and OpenTelemetry only logs a generic, rate-limited "Queue full"
    line.  Here the queue's length is read before each span goes in (one `len()`
    of a deque: no cost measurable beside `on_end`'s ~0.6 µs); a full queue's drop is counted
    in the guard's `dropped` (`GuardedExporter.queue_full`), or, with an exporter the
    host passed, in `dropped` here, and logged once.  The count is exact while one
    thread ends spans; threads that end spans at the same moment may be off by one.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int,
        schedule_delay_millis: float,
        max_export_batch_size: int,
    ) -> None:
        super().__init__(
            exporter,
            max_queue_size=max_queue_size,
            schedule_delay_millis=schedule_delay_millis,
            max_export_batch_size=max_export_batch_size,
        )
        self._tt_guard = exporter if isinstance(exporter, GuardedExporter) else None
        #: spans the full queue dropped (with the guard, also counted there)
        self.dropped = 0
        self._tt_queue_size = max_queue_size
        # opentelemetry-sdk >= 1.33 keeps the queue in a `BatchProcessor`; before, in
        # the span processor itself (`queue`, `done`)
        self._tt_holder: Any = getattr(self, "_batch_processor", self)
        queue = getattr(self._tt_holder, "_queue", None)
        if queue is None:
            queue = getattr(self._tt_holder, "queue", None)
        self._tt_queue: Any = ()
        self._tt_full_at = 1
        if isinstance(queue, deque) and queue.maxlen:
            self._tt_queue, self._tt_full_at = queue, queue.maxlen
        emit = getattr(self._tt_holder, "emit", None) if self._tt_holder is not self else None
        self._tt_emit: Callable[[ReadableSpan], None] | None = emit if callable(emit) else None

    def on_end(self, span: ReadableSpan) -> None:
        emit = self._tt_emit
        if emit is None:  # opentelemetry-sdk before its `BatchProcessor`
            if len(self._tt_queue) >= self._tt_full_at:
                self._count_drop(span)
            BatchSpanProcessor.on_end(self, span)
            return
        # OpenTelemetry's own `on_end` (sampled spans go to `emit`), with the count:
        # one call less than calling it, so the check costs nothing measurable
        context = span.context
        if not (context and context.trace_flags.sampled):
            return
        if len(self._tt_queue) >= self._tt_full_at:
            self._count_drop(span)
        emit(span)

    def _count_drop(self, span: ReadableSpan) -> None:
        """A span ends while the queue is full: the processor drops one (when it queues it)."""
        try:
            context = span.context
            if context is None or not context.trace_flags.sampled:
                return  # not queued at all
            holder = self._tt_holder
            if getattr(holder, "_shutdown", False) or getattr(holder, "done", False):
                return  # shut down: dropped without queueing, as every span from now on
            self.dropped += 1
            guard = self._tt_guard
            if guard is not None:
                guard.queue_full(self._tt_queue_size)
            else:
                log_once(
                    "the span queue is full",
                    detail=f" ({self._tt_queue_size} spans): the exporter takes spans slower "
                    "than they end, and spans are dropped (counted in the processor's `dropped`)",
                )
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("span queue drop count", exc)


def _no_retry_session(guard: GuardedExporter) -> Any:
    """Gives a `requests.Session` whose connection errors the OTLP/HTTP exporter
    does not retry after backoff: the exporter's immediate second try (a pooled
    connection the collector closed) is left; a second failure in the same export
    ends it.  `requests` comes with the OTLP/HTTP exporter; imported here, at
    `configure()`, not with the package."""
    import requests

    class NoRetrySession(requests.Session):
        def request(self, method: Any, url: Any, *args: Any, **kwargs: Any) -> Any:
            guard.attempts += 1
            try:
                return super().request(method, url, *args, **kwargs)
            except (requests.ConnectionError, requests.Timeout) as exc:
                if guard.attempts > 1:
                    raise Unreachable(f"{type(exc).__name__}: {exc}") from exc
                raise

    return NoRetrySession()


def otlp_exporter(url: str, protocol: str) -> GuardedExporter:
    """Gives the guarded OTLP span exporter to `url`: over OTLP/HTTP the full traces
    URL, used as given (`…/v1/traces`, or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as
    written: `Settings.traces_endpoint`); over gRPC the collector's endpoint."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as Grpc,
        )

        return GuardedExporter(
            Grpc(
                endpoint=url,
                insecure=url.startswith("http://"),
                timeout=EXPORT_TIMEOUT_S,  # type: ignore[arg-type]  # seconds; typed int in old releases
            ),
            url,
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    guard = GuardedExporter(None, url)
    guard.inner = Http(
        endpoint=url,
        timeout=EXPORT_TIMEOUT_S,
        session=_no_retry_session(guard),
    )
    return guard


# -- bounded waits -------------------------------------------------------------

_PENDING = object()


class SingleFlight:
    """Runs a call on a daemon thread, one at a time, and waits at most a timeout.

    `run_bounded`'s thread a call would pile up behind a slow collector: OpenTelemetry's
    flush waits on its export lock whatever its timeout, and a host calling
    `force_flush(200)` after each unit of work had a hundred threads waiting in 30 s.
    Here at most one runs: a call that comes while one is under way waits (up to its
    own timeout) for the next round, which starts when that one ends and serves every
    call that came meanwhile.  A round that starts after a call began covers what that
    call had to flush.  A forked child starts afresh (the parent's thread is not there).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        #: the last round asked for, started, and ended
        self._asked = self._started = self._ended = 0
        self._fn: Callable[[], Any] | None = None
        self._result: Any = None
        self._running = False
        self._pid = os.getpid()

    def run(self, fn: Callable[[], Any], timeout_s: float) -> tuple[bool, Any]:
        """Has `fn` (or a call that came after it) run once more; gives (whether that
        ended within `timeout_s`, what it gave).  What overruns goes on in the background."""
        if self._pid != os.getpid():
            self._reset()
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            mine = self._asked = self._started + 1
            self._fn = fn
            if not self._running:
                thread = threading.Thread(
                    target=self._loop, name=f"tokentrace-{self.name}", daemon=True
                )
                thread.start()
                self._running = True
            while self._ended < mine:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False, None
                self._cond.wait(left)
            return True, self._result

    @property
    def running(self) -> bool:
        return self._running

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    if self._started >= self._asked:
                        self._running = False
                        return
                    self._started += 1
                    round_, fn = self._started, self._fn
                result = None
                try:
                    result = None if fn is None else fn()
                except Exception as exc:  # the SDK's own failure must never reach the host
                    log_once(self.name, exc)
                with self._cond:
                    self._ended, self._result = round_, result
                    self._cond.notify_all()
        except BaseException:
            with self._cond:
                self._running = False
            raise


def run_bounded(fn: Callable[[], Any], timeout_s: float, name: str) -> tuple[bool, Any]:
    """Runs `fn` on a daemon thread and waits at most `timeout_s`; gives
    (whether it finished, what it gave).  What overruns goes on in the background."""
    box: list[Any] = [_PENDING]

    def target() -> None:
        try:
            box[0] = fn()
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once(name, exc)
            box[0] = None

    thread = threading.Thread(target=target, name=f"tokentrace-{name}", daemon=True)
    thread.start()
    thread.join(max(0.0, timeout_s))
    result = box[0]
    return (result is not _PENDING, None if result is _PENDING else result)
