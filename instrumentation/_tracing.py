"""A configuration of the SDK (`Tracing`): its settings, tracer provider, tracer and exporter."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import DEFAULT_ON
from opentelemetry.trace import Tracer

from tokentrace.instrumentation import _export, _pending_span
from tokentrace.instrumentation._export import SHUTDOWN_TIMEOUT_S, GuardedExporter
from tokentrace.instrumentation._pending_span import PresetIdGenerator
from tokentrace.instrumentation._safety import logger
from tokentrace.instrumentation._settings import Settings

SCOPE_NAME = "tokentrace"
#: the span queue of the SDK's own provider (spans; a full queue drops, counted) and
#: its export batches
SPAN_QUEUE_SIZE = 8192
SPAN_BATCH_SIZE = 512
SPAN_SCHEDULE_DELAY_MS = 500


def _nothing_waits() -> None:
    pass


class HashOnceResource(Resource):
    """A resource whose hash is computed once.

    OpenTelemetry's OTLP encoder groups the spans of every export batch by
    resource and so hashes the resource once a span; `Resource.__hash__`
    JSON-encodes all its attributes, sorted, each time: a fifth to a quarter
    of encoding a request's spans (opentelemetry-sdk 1.45, benchmarks/bench_sdk.py).
    A resource never changes, so its hash is kept.  Equal to, and hashed
    like, a plain `Resource` with the same attributes.
    """

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


class Tracing:
    """The SDK's live state: settings, tracer provider and tracer."""

    def __init__(
        self,
        settings: Settings,
        provider: TracerProvider,
        owns_provider: bool,
        exporter: GuardedExporter | None = None,
        *,
        before_flush: Callable[[], object] = _nothing_waits,
    ) -> None:
        self.settings = settings
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer(SCOPE_NAME)
        self._owns_provider = owns_provider
        #: the guarded OTLP exporter, when the SDK made it (not a host's `exporter=`)
        self.exporter = exporter
        #: set once `shutdown()` ran (or `configure()` replaced it): what is
        #: still in flight moves to the configuration current then, if any
        self.closed = False
        #: set when request spans may be built off the host's thread with ids
        #: drawn at the start: our own provider, its id generator, the default sampler
        self.pending_ids: PresetIdGenerator | None = None
        #: `configure()`'s own arguments, when it made the provider: a forked
        #: child makes its configuration again from them (`Runtime.after_fork_in_child`)
        self.configured_with: dict[str, Any] | None = None
        ids = getattr(provider, "id_generator", None)
        if owns_provider and isinstance(ids, PresetIdGenerator) and provider.sampler is DEFAULT_ON:
            self.pending_ids = ids
        #: builds what waits in the SDK's queues (finished requests, engine steps,
        #: CUDA timings, GPU samples) before the provider flushes, so it leaves too
        self._before_flush = before_flush
        #: the provider flush under way: one at a time, later calls wait on it
        self._flush = _export.SingleFlight("flush")

    def force_flush(self, timeout_ms: int = 10_000) -> bool:
        """Emits buffered engine steps / timings, then flushes spans; gives success.

        Returns within about `timeout_ms` (OpenTelemetry's batch processor ignores
        it): False when the flush did not end by then (it goes on in the
        background) or spans were dropped, the collector being unreachable or
        slower than spans end.  One provider flush runs at a time: a call made
        while one is under way waits for it, then for the next (which covers this
        call's spans), never starting a thread of its own.
        """
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        exporter = self.exporter
        dropped = exporter.dropped if exporter is not None else 0
        self._before_flush()
        left = max(0.0, deadline - time.monotonic())
        finished, ok = self._flush.run(lambda: self.provider.force_flush(int(left * 1000)), left)
        return bool(finished and ok) and (exporter is None or exporter.dropped == dropped)

    def shutdown(self, timeout_ms: int | None = None) -> bool:
        """Ends the provider (when the SDK made it): what is queued is exported for
        `timeout_ms` at most (default `SHUTDOWN_TIMEOUT_S`), then dropped; gives
        whether it ended in time.  Never waits on the collector longer than that."""
        self.closed = True
        if not self._owns_provider:
            return True
        timeout_s = SHUTDOWN_TIMEOUT_S if timeout_ms is None else max(0, timeout_ms) / 1000
        exporter = self.exporter
        if exporter is not None:
            exporter.begin_shutdown(time.monotonic() + timeout_s)
        finished, _ = _export.run_bounded(self.provider.shutdown, timeout_s, "shutdown")
        if not finished and exporter is not None:
            exporter.abort()  # its export under way ends at its retry wait; the rest is dropped
        return finished


def end(tracing: Tracing, timeout_ms: int) -> None:
    """Ends `tracing` for `tt.shutdown()` within `timeout_ms`: the SDK's own provider
    exports what is queued and stops; a host's provider is flushed, and stays the host's."""
    if tracing._owns_provider:
        tracing.shutdown(timeout_ms)
        return
    try:
        tracing.force_flush(timeout_ms)
    finally:
        tracing.shutdown()


def build(
    settings: Settings,
    *,
    resource_attributes: dict[str, Any] | None,
    tracer_provider: TracerProvider | None,
    exporter: SpanExporter | None,
    before_flush: Callable[[], object],
) -> Tracing:
    """Gives a configuration for `settings`: the host's `tracer_provider` as it is, or a
    provider of the SDK's own that exports (to `exporter`, else over OTLP) unless disabled."""
    if tracer_provider is not None:
        _warn_if_lists_get_cut(tracer_provider)
        return Tracing(settings, tracer_provider, owns_provider=False, before_flush=before_flush)
    attrs: dict[str, Any] = {"service.name": settings.service_name, "process.pid": os.getpid()}
    attrs.update(resource_attributes or {})
    # no atexit shutdown of its own: OpenTelemetry's waits up to 30 s and more on
    # a dead collector; the SDK's exit flush ends it within SHUTDOWN_TIMEOUT_S
    provider = TracerProvider(
        resource=HashOnceResource(Resource.create(attrs)),
        id_generator=PresetIdGenerator(),
        shutdown_on_exit=False,
    )
    # a pending request span keeps what a live one would (its events, its links)
    _pending_span.use_span_limits(provider)
    guarded: GuardedExporter | None = None
    if not settings.disabled:
        # Bounded queue, export on a daemon thread: the host never waits on
        # the collector, and a dead or slow collector costs dropped spans
        # (counted, logged), not latency.
        if exporter is None:
            # guarded: a collector that is down or never answers costs dropped
            # spans, never the host's time (see `_export`)
            exporter = guarded = _export.otlp_exporter(settings.traces_endpoint, settings.protocol)
        provider.add_span_processor(
            _export.CountingBatchSpanProcessor(
                exporter,
                max_queue_size=SPAN_QUEUE_SIZE,
                schedule_delay_millis=SPAN_SCHEDULE_DELAY_MS,
                max_export_batch_size=SPAN_BATCH_SIZE,
            )
        )
    _warn_if_lists_get_cut(provider)
    return Tracing(
        settings, provider, owns_provider=True, exporter=guarded, before_flush=before_flush
    )


def build_exporting_nothing(settings: Settings, before_flush: Callable[[], object]) -> Tracing:
    """Gives a configuration that records but exports nothing, its settings `settings`
    marked disabled."""
    # no processor: no export (and nothing to end at exit); an empty resource:
    # `Resource.create` runs its detectors on a thread pool, which fails once
    # the interpreter shuts down (a GPU sampler or request still running then)
    provider = TracerProvider(
        resource=Resource.get_empty(),
        id_generator=PresetIdGenerator(),
        shutdown_on_exit=False,
    )
    return Tracing(
        replace(settings, disabled=True), provider, owns_provider=True, before_flush=before_flush
    )


def _warn_if_lists_get_cut(provider: TracerProvider) -> None:
    """Says when an attribute length limit will cut the SDK's packed lists short.

    Token times and engine steps travel as one JSON string each (semconv.PACKED_LISTS);
    a cut string is unreadable, and the analyzer ignores it.
    """
    # OpenTelemetry has no public accessor; the limits come from SpanLimits or
    # OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT / OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT
    limits = getattr(provider, "_span_limits", None)
    limit = getattr(limits, "max_span_attribute_length", None)
    if isinstance(limit, int) and limit >= 0:
        logger.warning(
            "tokentrace: span attribute values are limited to %d characters "
            "(OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT / OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT or "
            "SpanLimits): token times and engine steps packed longer than that (a token "
            "~8 characters, a step's request ids many more) are cut short and ignored by the "
            "analyzer; unset the limit",
            limit,
        )
