"""An exception's message may quote the prompt: recorded only with `record_content`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

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


class Unprintable(Exception):
    """An exception whose own `__str__` fails (OpenTelemetry's record_exception calls it)."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")


@pytest.mark.parametrize("what", [sc.SPAN_REQUEST, sc.SPAN_CLIENT])
def test_an_exception_whose_str_raises_still_fails_the_span(sdk, what: str) -> None:  # type: ignore[no-untyped-def]
    exporter, record_content = sdk
    error = Unprintable()
    with pytest.raises(Unprintable) as raised:
        with tt.request() if what == sc.SPAN_REQUEST else tt.client_request():
            raise error
    assert raised.value is error  # the host's own exception, unchanged
    (span,) = _spans(exporter, what)  # exported, not lost in the build
    (event,) = [e for e in span.events if e.name == "exception"]
    assert span.status.status_code is StatusCode.ERROR
    assert event.attributes["exception.type"].endswith("Unprintable")
    assert "test_an_exception_whose_str_raises" in event.attributes["exception.stacktrace"]
    if record_content:
        assert event.attributes["exception.message"] == "<unprintable Unprintable object>"
        assert span.status.description == "Unprintable: <unprintable Unprintable object>"
    else:
        assert span.status.description == "Unprintable"


def test_a_call_on_the_pending_span_that_fails_at_the_build_loses_only_itself(sdk) -> None:  # type: ignore[no-untyped-def]
    """The host records an exception on `req.span` itself: replayed when the span is built."""
    exporter, _ = sdk
    with tt.request(request_id="kept") as req:
        req.span.record_exception(Unprintable())
        req.span.set_attribute("app.after", 1)
    (span,) = _spans(exporter, sc.SPAN_REQUEST)
    assert span.attributes[sc.REQUEST_ID] == "kept"
    assert span.attributes["app.after"] == 1
    assert span.status.status_code is StatusCode.UNSET
