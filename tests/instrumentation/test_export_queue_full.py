"""A collector slower than spans end: the spans the full span queue drops are counted
and logged, as an outage's are; nothing goes missing without a count.

A real OTLP/HTTP receiver on 127.0.0.1 holds its answer until the test opens its
gate: OpenTelemetry's batch processor exports one batch at a time, so while it waits
the queue fills and every span ended after that pushes one out.  Before, those were
lost silently: 60,000 spans ended against a collector answering in 2 s, 9,883
delivered, `dropped` 0, nothing logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence

import pytest
from _gated_otlp import GatedTraceReceiver
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _export, _safety, _tracing

QUEUE = 64
BATCH = 16


@pytest.fixture
def small_queue(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(_tracing, "SPAN_QUEUE_SIZE", QUEUE, raising=False)
    monkeypatch.setattr(_tracing, "SPAN_BATCH_SIZE", BATCH, raising=False)
    # the held export must not time out while the test holds it (3 s by default)
    monkeypatch.setattr(_export, "EXPORT_TIMEOUT_S", 60.0)
    yield
    tt.shutdown()


@pytest.fixture
def receiver() -> Iterator[GatedTraceReceiver]:
    r = GatedTraceReceiver()
    yield r
    r.close()


def _end_spans(tracing: tt.Tracing, count: int) -> None:
    for i in range(count):
        tracing.tracer.start_span(f"s{i}").end()


def _messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.mark.slow
def test_spans_the_full_queue_drops_are_counted_and_logged(  # type: ignore[no-untyped-def]
    small_queue, receiver, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="tokentrace")
    tracing = tt.configure(endpoint=receiver.url, service_name="slow-collector")
    guard = tracing.exporter
    assert guard is not None
    # one batch goes to the collector, which holds it: the worker waits there
    _end_spans(tracing, BATCH)
    assert receiver.wait_for_exports(1)
    # meanwhile the queue fills, and each span ended after that pushes one out
    extra = 300
    _end_spans(tracing, extra)
    assert guard.dropped == extra - QUEUE
    assert guard.queue_full_dropped == extra - QUEUE
    (full,) = _messages(caplog, "the span queue is full")
    assert f"({QUEUE} spans)" in full and receiver.url in full
    # the collector answers again: what was queued arrives, and the count is said once
    receiver.gate.set()
    assert tracing.force_flush(30_000) is True  # nothing dropped during this flush
    ended = BATCH + extra
    assert receiver.spans + guard.dropped == ended  # every span delivered or counted
    assert receiver.spans == BATCH + QUEUE
    (back,) = _messages(caplog, "keeps up again;")
    assert f"{extra - QUEUE} spans were dropped while the span queue was full" in back


def test_the_queue_count_with_an_exporter_of_the_hosts(monkeypatch, small_queue) -> None:  # type: ignore[no-untyped-def]
    """An exporter the host passes has no guard: the processor counts, and says it once."""
    gate, entered = threading.Event(), threading.Event()

    class Held(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            entered.set()
            gate.wait(60)
            return SpanExportResult.SUCCESS

    monkeypatch.setattr(_safety, "_seen", set())
    logged: list[str] = []
    monkeypatch.setattr(_safety.logger, "warning", lambda msg, *a, **k: logged.append(msg % a))
    tracing = tt.configure(service_name="host-exporter", exporter=Held())
    try:
        _end_spans(tracing, BATCH)
        assert entered.wait(30)
        _end_spans(tracing, 100)
        (processor,) = tracing.provider._active_span_processor._span_processors
        assert getattr(processor, "dropped", 0) == 100 - QUEUE
        assert sum("the span queue is full" in line for line in logged) == 1
    finally:
        gate.set()
