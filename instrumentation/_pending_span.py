"""A request span whose ids exist at once and whose OpenTelemetry span is built later.

Starting an OpenTelemetry span runs a few dozen Python functions (sampler, id
generator, attribute checks, span processors).  Hot, that is ~10 µs; on a
serving loop's thread, right after a forward pass has streamed the model's
weights through the caches, it was measured at ~90 µs, a request start
costing more than ten decode steps' worth of SDK work.  So a request span is
*pending* on the host's thread: its trace and span ids are drawn at once (for
`traceparent`, for OpenTelemetry's current span inside the request, for child
spans), what is done to it is recorded, and the daemon finisher thread builds
the real span with those same ids —
through `PresetIdGenerator`, the id generator of the provider tokentrace
configures — and replays what was recorded.

What is recorded is bounded as on a live span: events (`add_event`,
`record_exception`) and links beyond the provider's span limits (`max_events`,
`max_links`: 128 each by default) push out the oldest and are counted, so that
the built span's `dropped_events` / `dropped_links` say what a live span's would;
`set_status` keeps the one call that decides the status.

Only where the outcome is certain: with a provider tokentrace made itself
and OpenTelemetry's default sampler (parent-based, always on).  With the
host's own provider or another sampler, spans start at once as before.
Unlike OpenTelemetry's parent-based sampling, a caller's trace that is not
sampled does not make the request unrecorded (`follows_unsampled_callers`).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, Tracer
from opentelemetry.util import types

from tokentrace.instrumentation._safety import log_once

_getrandbits = random.getrandbits
#: what a span drawn here carries: sampled, and (W3C level 2) a random trace id
_SAMPLED_RANDOM = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)
#: one lock for all pending spans: what they record is rare (errors, late
#: attributes) and a lock per request would be made on the hot path
_ops_lock = threading.Lock()


def after_fork_in_child() -> None:
    """Makes the pending spans' lock again in a forked child (run by the runtime's
    at-fork handler)."""
    # another thread may have held it at the fork (a request's late attribute
    # or error): the child's first one would wait forever
    global _ops_lock
    _ops_lock = threading.Lock()


#: OpenTelemetry's sampler variable: a host that names one (`parentbased_always_on`
#: included) has its callers' sampling decisions followed, as OpenTelemetry does
ENV_OTEL_SAMPLER = "OTEL_TRACES_SAMPLER"


def follows_unsampled_callers() -> bool:
    """Whether a request whose caller sampled its trace out records nothing.

    Not by default: tokentrace's own provider records every request, so that its
    numbers reach the collector.  With a sampler the host chose (`OTEL_TRACES_SAMPLER`,
    or its own `tracer_provider=`, whose spans start at once, by its sampler) the
    caller's decision is followed.  Read when a caller's trace is unsampled only.
    """
    return bool(os.environ.get(ENV_OTEL_SAMPLER, "").strip())


def _nothing() -> None:
    pass


#: OpenTelemetry's defaults (`SpanLimits`: `OTEL_SPAN_EVENT_COUNT_LIMIT`,
#: `OTEL_SPAN_LINK_COUNT_LIMIT`); None: no limit
DEFAULT_MAX_EVENTS = 128
DEFAULT_MAX_LINKS = 128
#: the events and links a pending span keeps, as the provider's spans would
_max_events: int | None = DEFAULT_MAX_EVENTS
_max_links: int | None = DEFAULT_MAX_LINKS


def use_span_limits(provider: object) -> None:
    """Has pending spans keep the events and links `provider`'s spans keep (its
    `SpanLimits`, read from the environment when it was made): called by `configure()`."""
    global _max_events, _max_links
    limits = getattr(provider, "_span_limits", None)  # OpenTelemetry has no public accessor
    events = getattr(limits, "max_events", DEFAULT_MAX_EVENTS)
    links = getattr(limits, "max_links", DEFAULT_MAX_LINKS)
    _max_events = events if events is None or isinstance(events, int) else DEFAULT_MAX_EVENTS
    _max_links = links if links is None or isinstance(links, int) else DEFAULT_MAX_LINKS


def _is_valid_link(context: trace.SpanContext, attributes: types.Attributes) -> bool:
    """Whether a live span keeps this link (OpenTelemetry's own test, not public)."""
    return bool(context and (context.is_valid or (attributes or context.trace_state)))


def _add_dropped(bounded: object, count: int) -> None:
    """Adds `count` to a live span's dropped events or links (a `BoundedList`): called
    while it is being built, under `_ops_lock`, before any other thread can reach it."""
    if count and isinstance(bounded, BoundedList):
        bounded.dropped += count


class PresetIdGenerator(RandomIdGenerator):
    """Random ids, except on a thread that announced the ids of the span it starts next."""

    def __init__(self) -> None:
        self._preset = threading.local()

    def _take(self, which: str) -> int | None:
        announced: int | None = getattr(self._preset, which, None)
        if announced is not None:
            setattr(self._preset, which, None)
        return announced

    def generate_trace_id(self) -> int:
        announced = self._take("trace_id")
        return super().generate_trace_id() if announced is None else announced

    def generate_span_id(self) -> int:
        announced = self._take("span_id")
        return super().generate_span_id() if announced is None else announced

    def start_span_with_ids(
        self, tracer: Tracer, trace_id: int, span_id: int, name: str, **kwargs: Any
    ) -> trace.Span:
        """Starts a span on this thread whose ids are `trace_id` (unless it has a parent) and `span_id`."""
        preset = self._preset
        preset.trace_id, preset.span_id = trace_id, span_id
        try:
            return tracer.start_span(name, **kwargs)
        finally:
            preset.trace_id = preset.span_id = None


_Op = Callable[[trace.Span], object]


class _Recorded:
    """What was done to a pending span, replayed on the real one: events and links
    bounded as a live span's (the oldest pushed out, counted), and the status call
    that decides (the first OK, which a live span keeps, or else the last)."""

    __slots__ = ("events", "links", "dropped_events", "dropped_links", "status", "status_final")

    def __init__(self) -> None:
        self.events: deque[_Op] | None = None
        self.links: deque[_Op] | None = None
        self.dropped_events = 0
        self.dropped_links = 0
        self.status: _Op | None = None
        self.status_final = False

    def in_order(self) -> tuple[Iterable[_Op], ...]:
        """Links, events, the status: as independent on a live span as in any order."""
        status = self.status
        return (self.links or (), self.events or (), () if status is None else (status,))


class PendingSpan(trace.Span):
    """Stands in for a request span until the finisher builds it; then forwards to it.

    Everything the OpenTelemetry Span API allows is recorded and replayed on the
    real span (events and links bounded as a live span's: `_Recorded`), so
    `req.span.set_attribute(...)` or `record_exception(...)` on the host's thread
    behave as on a live span.
    """

    __slots__ = (
        "_name",
        "_attributes",
        "_parent",
        "_trace_id",
        "_span_id",
        "_flags",
        "_trace_state",
        "_start_ns",
        "_ops",
        "_real",
        "_ctx",
        "_on_end",
    )

    def __init__(
        self,
        name: str,
        attributes: dict[str, Any],
        parent: otel_context.Context | None,
        start_ns: int,
        on_end: Callable[[], object],
    ) -> None:
        self._name = name
        self._on_end = on_end
        #: the request's own attribute dict: set_attribute lands here until the build
        self._attributes = attributes
        self._parent = parent
        self._start_ns = start_ns
        self._trace_id = 0
        self._trace_state = None
        self._flags = _SAMPLED_RANDOM
        if parent is not None:
            sc = trace.get_current_span(parent).get_span_context()
            if sc.is_valid:  # a continued trace: its id, its state, and (see below) sampled
                self._trace_id = sc.trace_id
                self._trace_state = sc.trace_state
                flags = TraceFlags.RANDOM_TRACE_ID if sc.trace_flags.random_trace_id else 0
                if sc.trace_flags.sampled:
                    flags |= TraceFlags.SAMPLED
                elif not follows_unsampled_callers():
                    # A caller that sampled its trace out (a gateway's head sampling)
                    # still gets this request recorded: the collector summarizes
                    # every request and samples the spans itself (docs/design.md §4,
                    # "sample the spans, never the numbers").  The trace id and
                    # parent stay, so a trace the caller does keep is still whole.
                    flags |= TraceFlags.SAMPLED
                    self._parent = trace.set_span_in_context(
                        trace.NonRecordingSpan(
                            SpanContext(
                                sc.trace_id,
                                sc.span_id,
                                is_remote=sc.is_remote,
                                trace_flags=TraceFlags(sc.trace_flags | TraceFlags.SAMPLED),
                                trace_state=sc.trace_state,
                            )
                        ),
                        parent,
                    )
                self._flags = TraceFlags(flags)
            else:
                self._parent = None
        if not self._trace_id:
            self._trace_id = _getrandbits(128) or 1
        self._span_id = _getrandbits(64) or 1
        #: what was recorded (made at the first call: most requests record nothing)
        self._ops: _Recorded | None = None
        self._real: trace.Span | None = None
        self._ctx: SpanContext | None = None

    # ---- the finisher's side ------------------------------------------------
    def build(self, tracer: Tracer, ids: PresetIdGenerator | None) -> trace.Span:
        """Starts the real span with the announced ids and replays what was recorded.

        Without `ids` (the host's provider, configured while the request ran)
        the span gets ids of the provider's choosing.
        """
        with _ops_lock:
            kwargs: dict[str, Any] = {
                "context": self._parent,
                "kind": SpanKind.SERVER,
                "attributes": self._attributes,
                "start_time": self._start_ns,
            }
            if ids is None:
                real = tracer.start_span(self._name, **kwargs)
            else:
                real = ids.start_span_with_ids(
                    tracer, self._trace_id, self._span_id, self._name, **kwargs
                )
            recorded = self._ops or _Recorded()
            for ops in recorded.in_order():
                for op in ops:
                    try:
                        op(real)
                    except Exception as exc:  # one bad call (an exception whose str() raises)
                        # must not lose the span; the type only: its message may quote content
                        log_once(
                            "a call on a request span failed when the span was built",
                            detail=f" ({type(exc).__name__}; that call is left out, the span kept)",
                        )
            # what the limits pushed out, counted as the live span counts its own
            _add_dropped(getattr(real, "_events", None), recorded.dropped_events)
            _add_dropped(getattr(real, "_links", None), recorded.dropped_links)
            self._ops = None
            self._real = real
        return real

    def release(self) -> None:
        """Forgets the request (its `finish`): a span never built must not keep a cycle alive."""
        self._on_end = _nothing

    @property
    def sampled(self) -> bool:
        return self._flags.sampled

    def _recorded(self) -> _Recorded:
        ops = self._ops  # under _ops_lock
        if ops is None:
            ops = self._ops = _Recorded()
        return ops

    def _record_event(self, op: Callable[[trace.Span], object]) -> None:
        """Records an event (`add_event`, `record_exception`): the last `max_events` are kept."""
        self._record_capped(op, "events", _max_events)

    def _record_link(self, op: Callable[[trace.Span], object]) -> None:
        """Records a link: the last `max_links` are kept."""
        self._record_capped(op, "links", _max_links)

    def _record_capped(
        self, op: Callable[[trace.Span], object], kind: str, limit: int | None
    ) -> None:
        """Records an event or a link (`kind`, "events" or "links"): the last `limit` are
        kept and the older ones counted as dropped, as a live span keeps them."""
        with _ops_lock:
            real = self._real
            if real is None:
                ops = self._recorded()
                kept = getattr(ops, kind)
                if kept is None:
                    kept = deque(maxlen=limit)
                    setattr(ops, kind, kept)
                if kept.maxlen is not None and len(kept) >= kept.maxlen:
                    dropped = "dropped_" + kind  # the oldest goes (none kept: this one)
                    setattr(ops, dropped, getattr(ops, dropped) + 1)
                kept.append(op)
                return
        op(real)

    # ---- the OpenTelemetry Span API -----------------------------------------
    def get_span_context(self) -> SpanContext:
        ctx = self._ctx
        if ctx is None:
            ctx = self._ctx = SpanContext(
                self._trace_id,
                self._span_id,
                is_remote=False,
                trace_flags=self._flags,
                trace_state=self._trace_state,
            )
        return ctx

    def is_recording(self) -> bool:
        real = self._real
        return self._flags.sampled if real is None else real.is_recording()

    def set_attribute(self, key: str, value: types.AnyValue) -> None:
        with _ops_lock:
            if self._real is None:
                self._attributes[key] = value  # checked by OpenTelemetry at the build
                return
        self._real.set_attribute(key, value)

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def add_event(
        self, name: str, attributes: types.Attributes = None, timestamp: int | None = None
    ) -> None:
        at = time.time_ns() if timestamp is None else timestamp
        self._record_event(lambda s: s.add_event(name, attributes, at))

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        if not _is_valid_link(context, attributes):
            return  # a live span ignores it, uncounted
        self._record_link(lambda s: s.add_link(context, attributes))

    def update_name(self, name: str) -> None:
        with _ops_lock:
            if self._real is None:
                self._name = name
                return
        self._real.update_name(name)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        # On a live span an OK status is final and UNSET is ignored: of every call, the
        # first OK or else the last other one decides; only that one is kept.
        code = status.status_code if isinstance(status, Status) else status
        with _ops_lock:
            real = self._real
            if real is None:
                ops = self._recorded()
                if code is StatusCode.UNSET or ops.status_final:
                    return
                ops.status = lambda s: s.set_status(status, description)
                ops.status_final = code is StatusCode.OK
                return
        real.set_status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        at = time.time_ns() if timestamp is None else timestamp
        self._record_event(lambda s: s.record_exception(exception, attributes, at, escaped))

    def end(self, end_time: int | None = None) -> None:
        """Ends the request: the same as its `finish()` (which takes the time itself)."""
        self._on_end()

    def __repr__(self) -> str:
        return f"PendingSpan(name={self._name!r}, context={self.get_span_context()!r})"
