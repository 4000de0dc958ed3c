"""TOKENTRACE_DISABLED / configure(disabled=True): the host keeps its API, and the SDK builds no
spans it would never export (~100 µs of CPU a request, for nothing)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from tokentrace import instrumentation as tt
from tokentrace.instrumentation._request import finisher
from tokentrace.instrumentation._steps import recorder


class CountingProcessor(SpanProcessor):
    def __init__(self) -> None:
        self.started = 0

    def on_start(self, span: Span, parent_context: object = None) -> None:
        self.started += 1

    def on_end(self, span: ReadableSpan) -> None:
        pass


@pytest.fixture
def disabled() -> Iterator[CountingProcessor]:
    tracing = tt.configure(disabled=True)
    counting = CountingProcessor()
    tracing.provider.add_span_processor(counting)  # sees any span the SDK would build
    yield counting
    tt.shutdown()


def test_requests_and_steps_build_no_spans(disabled: CountingProcessor) -> None:
    for _ in range(20):
        with tt.request(model="m") as req:
            with req.phase("prefill"):
                pass
            with tt.engine_step(decode=[req.request_id]):
                req.token()
            req.set_attribute("app.route", "/chat")  # the API still works
            assert req.traceparent()["traceparent"].startswith("00-")
    finisher.flush()
    recorder.flush()
    assert disabled.started == 0


def test_a_span_asked_for_is_released_not_built(disabled: CountingProcessor) -> None:
    req = tt.request()
    span = req.span  # the host asked for it: pending
    span.set_attribute("x", 1)
    req.finish()
    finisher.flush()
    assert disabled.started == 0
