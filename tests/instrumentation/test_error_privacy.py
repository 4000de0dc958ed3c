"""An exception's message may quote the prompt: recorded only with `record_content`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc

SECRET = "My SSN is 078-05-1120"


class PromptRejected(ValueError):
    pass


def _fail() -> None:
    raise PromptRejected(f"input_value={SECRET!r} is too long")


@pytest.fixture(params=[False, True], ids=["content off", "content on"])
def sdk(request: pytest.FixtureRequest) -> Iterator[tuple[InMemorySpanExporter, bool]]:
    exporter = InMemorySpanExporter()
    tt.configure(service_name="privacy", exporter=exporter, record_content=request.param)
    yield exporter, request.param
    tt.shutdown()


def _spans(exporter: InMemorySpanExporter, name: str) -> list:  # type: ignore[type-arg]
    assert tt.get_tracing().force_flush(5_000)
    return [s for s in exporter.get_finished_spans() if s.name == name]


@pytest.mark.parametrize("what", [sc.SPAN_REQUEST, sc.SPAN_CLIENT])
def test_an_exception_message_is_recorded_only_with_record_content(sdk, what: str) -> None:  # type: ignore[no-untyped-def]
    exporter, record_content = sdk
    with pytest.raises(PromptRejected):  # the host's exception passes unchanged
        with tt.request() if what == sc.SPAN_REQUEST else tt.client_request():
            _fail()
    (span,) = _spans(exporter, what)
    (event,) = [e for e in span.events if e.name == "exception"]
    recorded = repr(span.status.description) + repr(dict(event.attributes))
    assert not span.status.is_ok
    assert event.attributes["exception.type"].endswith("PromptRejected")
    assert "_fail" in event.attributes["exception.stacktrace"]  # where it was raised: kept
    assert (SECRET in recorded) is record_content
    if not record_content:
        assert span.status.description == "PromptRejected"
        assert "exception.message" not in event.attributes
