"""The pending request span keeps what a live span would: its events and links are
bounded by the provider's span limits, the rest counted as dropped.

Inside `with tt.request()` OpenTelemetry's current span is the request's pending
span; a library adding an event per streamed chunk had every call kept until the
finisher replayed it (100,000 events: 63.6 MB held, 15.3 s of replay) for a span
that keeps 128.  Real OpenTelemetry SDK spans are the reference here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace import Span as SdkSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _pending_span
from tokentrace.instrumentation import semconv as sc
from tokentrace.instrumentation._pending_span import PendingSpan

EVENTS = 1_000
LINKS = 300


def _link_context(i: int) -> SpanContext:
    return SpanContext(i + 1, i + 1, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _a_chatty_library(span: trace.Span) -> None:
    """Per streamed chunk an event, now and then a link, an exception, a status."""
    for i in range(EVENTS):
        span.add_event("chunk", {"i": i}, timestamp=1_700_000_000_000_000_000 + i)
        if i < LINKS:
            span.add_link(_link_context(i), {"n": i})
        if i % 100 == 0:
            span.record_exception(ValueError(f"chunk {i}"), timestamp=1_700_000_000_000_000_000)
            span.set_status(Status(StatusCode.ERROR, f"at {i}"))
        span.set_status(StatusCode.UNSET)
    span.add_link(SpanContext(0, 0, is_remote=False))  # invalid: a live span ignores it


def _live(what: Callable[[trace.Span], None]) -> ReadableSpan:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("live").start_span("live")
    what(span)
    span.end()
    (done,) = exporter.get_finished_spans()
    return done


@pytest.fixture
def sdk() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tt.configure(service_name="pending-limits", exporter=exporter)
    yield exporter
    tt.shutdown()


def _request_span(
    exporter: InMemorySpanExporter, what: Callable[[trace.Span], None]
) -> ReadableSpan:
    with tt.request(model="m"):
        span = trace.get_current_span()
        assert isinstance(span, PendingSpan)
        what(span)
    tt.get_tracing().force_flush(10_000)
    (done,) = [s for s in exporter.get_finished_spans() if s.name == sc.SPAN_REQUEST]
    return done


def _events(span: ReadableSpan) -> list[tuple[str, int]]:
    return [(e.name, e.timestamp) for e in span.events]


def test_a_pending_span_records_no_more_than_a_live_span_keeps(sdk, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    replayed = {"add_event": 0, "add_link": 0, "set_status": 0}
    for name in replayed:
        real = getattr(SdkSpan, name)

        def counting(self, *args, __real=real, __name=name, **kwargs):  # type: ignore[no-untyped-def]
            if self.name == sc.SPAN_REQUEST:
                replayed[__name] += 1
            return __real(self, *args, **kwargs)

        monkeypatch.setattr(SdkSpan, name, counting)
    got = _request_span(sdk, _a_chatty_library)
    # what the finisher replays on the built span is bounded by its limits
    assert replayed == {"add_event": 128, "add_link": 128, "set_status": 1}
    # and the exported span says what a live span would
    live = _live(_a_chatty_library)
    assert _events(got) == _events(live)
    assert [e.attributes for e in got.events] == [e.attributes for e in live.events]
    assert got.dropped_events == live.dropped_events == EVENTS + EVENTS // 100 - 128
    assert [link.context.span_id for link in got.links] == [
        link.context.span_id for link in live.links
    ]
    assert got.dropped_links == live.dropped_links == LINKS - 128
    assert got.status.status_code is live.status.status_code is StatusCode.ERROR
    assert got.status.description == live.status.description == "at 900"


def test_an_ok_status_is_final_as_on_a_live_span(sdk) -> None:  # type: ignore[no-untyped-def]
    def calls(span: trace.Span) -> None:
        span.set_status(StatusCode.ERROR, "first")
        span.set_status(Status(StatusCode.OK))
        span.set_status(StatusCode.ERROR, "after ok")

    got, live = _request_span(sdk, calls), _live(calls)
    assert got.status.status_code is live.status.status_code is StatusCode.OK


def test_the_providers_limits_from_the_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for name in ("_max_events", "_max_links"):  # the next configure() sets them again
        monkeypatch.setattr(_pending_span, name, getattr(_pending_span, name, None), raising=False)
    monkeypatch.setenv("OTEL_SPAN_EVENT_COUNT_LIMIT", "5")
    monkeypatch.setenv("OTEL_SPAN_LINK_COUNT_LIMIT", "0")
    exporter = InMemorySpanExporter()
    tt.configure(service_name="pending-env-limits", exporter=exporter)
    try:

        def calls(span: trace.Span) -> None:
            for i in range(20):
                span.add_event(f"e{i}", timestamp=1_700_000_000_000_000_000 + i)
                span.add_link(_link_context(i))

        got, live = _request_span(exporter, calls), _live(calls)
        assert [name for name, _ in _events(got)] == [f"e{i}" for i in range(15, 20)]
        assert _events(got) == _events(live)
        assert got.dropped_events == live.dropped_events == 15
        assert not got.links and got.dropped_links == live.dropped_links == 20
    finally:
        tt.shutdown()
