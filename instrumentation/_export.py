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
* `run_bounded` runs a flush or shutdown on a daemon thread and waits at most
  its timeout: the caller never waits on the collector longer than that.
* `shutdown_in_background` ends a replaced configuration off the caller's
  thread; `wait_for_background` (at `tt.shutdown()` and exit) gives those the
  time left, so that their last spans still leave while the collector answers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

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
        #: spans dropped in all, and in the outage under way
        self.dropped = 0
        self._dropped_in_outage = 0

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
        try:
            result = inner.export(spans)
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("span export", exc)
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            if self.breaker.succeeded():
                with self._lock:
                    dropped, self._dropped_in_outage = self._dropped_in_outage, 0
                logger.warning(
                    "tokentrace: the collector at %s takes spans again; %d spans were dropped "
                    "while it did not",
                    self.endpoint,
                    dropped,
                )
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
        if dropped:
            logger.warning(
                "tokentrace: shut down with the collector at %s unreachable: %d spans dropped",
                self.endpoint,
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


_background: set[threading.Thread] = set()
_background_lock = threading.Lock()


def shutdown_in_background(fn: Callable[[], object], name: str) -> threading.Thread:
    """Runs `fn` (a replaced configuration's shutdown) on a daemon thread; remembered
    until it ends so that `wait_for_background` can give it the time left."""

    def target() -> None:
        try:
            fn()
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once(name, exc)
        finally:
            with _background_lock:
                _background.discard(thread)

    thread = threading.Thread(target=target, name=f"tokentrace-{name}", daemon=True)
    with _background_lock:
        _background.add(thread)
    thread.start()
    return thread


def wait_for_background(deadline: float) -> bool:
    """Waits until `deadline` (monotonic seconds) at most for background shutdowns;
    gives whether all ended."""
    with _background_lock:
        threads = list(_background)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in threads)


def after_fork_in_child() -> None:
    """The parent's background threads do not exist in a forked child."""
    global _background_lock
    _background_lock = threading.Lock()
    _background.clear()
