"""Cold-start marking: first N requests after start, and again after an idle gap."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _cold_start
from tokentrace.instrumentation import semconv as sc
from tokentrace.instrumentation._cold_start import ColdStartTracker


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_tracker_marks_first_requests_and_after_idle_gap() -> None:
    clock = FakeClock()
    tracker = ColdStartTracker(clock)
    marks = [tracker.observe(2, 300.0) for _ in range(4)]
    assert marks == [True, True, False, False]
    clock.now += 299.0
    assert tracker.observe(2, 300.0) is False
    clock.now += 300.0
    assert [tracker.observe(2, 300.0) for _ in range(3)] == [True, True, False]


def test_request_spans_carry_the_mark() -> None:
    _cold_start.tracker.reset()
    exporter = InMemorySpanExporter()
    tracing = tt.configure(service_name="cold", exporter=exporter, cold_start_requests=2)
    try:
        for _ in range(3):
            with tt.request(model="m"):
                pass
        assert tracing.force_flush()
        spans = [s for s in exporter.get_finished_spans() if s.name == sc.SPAN_REQUEST]
    finally:
        tt.shutdown()
        _cold_start.tracker.reset()
    assert [bool(s.attributes.get(sc.COLD_START, False)) for s in spans] == [True, True, False]


def test_bad_cold_start_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="cold_start_requests"):
        tt.configure(service_name="x", disabled=True, cold_start_requests=-1)
    with pytest.raises(ValueError, match="cold_start_idle_s"):
        tt.configure(service_name="x", disabled=True, cold_start_idle_s=0)
