"""Which trace a request joins when no caller's headers are given, and from WSGI environs."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tokentrace import instrumentation as tt
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.collector.otlp import decode_protobuf
from tokentrace.instrumentation import semconv as sc

USER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
USER_SPAN = "00f067aa0ba902b7"


def test_request_inside_a_hosts_server_span_is_its_child(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """A framework's own OpenTelemetry instrumentation made the SERVER span: the request
    is part of that trace (it was a trace of its own with tokentrace's provider)."""
    tracer = memory_sdk.tracing.tracer
    with tracer.start_as_current_span("GET /v1/chat", kind=SpanKind.SERVER) as host:
        with tt.request(request_id="r1") as req:
            req.token()
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert span.context.trace_id == host.get_span_context().trace_id
    assert span.parent.span_id == host.get_span_context().span_id


def test_in_process_client_and_server_measure_the_network(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """A client span around an in-process server call: one request, its network the time
    outside the server's span (it was counted twice: a client-only row and the server's)."""
    with tt.client_request(model="m") as call:
        time.sleep(0.02)  # the way there
        with tt.request(request_id="r1", model="m") as req:
            req.token()
        call.chunk()
    (client,) = memory_sdk.spans(sc.SPAN_CLIENT)
    (server,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert server.parent.span_id == client.context.span_id
    (summary,) = summarize_trace(decode_protobuf(memory_sdk.otlp_bytes())).requests
    assert summary.request_id == "r1" and summary.network_ms >= 20


@pytest.fixture
def host_provider_sdk() -> Iterator[tuple[InMemorySpanExporter, tt.Tracing]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = tt.configure(service_name="host", tracer_provider=provider)
    yield exporter, tracing
    tt.shutdown()
    provider.shutdown()


@pytest.mark.parametrize("provider", ["tokentrace's", "the host's"])
def test_request_inside_another_request_is_a_trace_of_its_own(
    memory_sdk, request, provider: str
) -> None:  # type: ignore[no-untyped-def]
    """A re-entrant handler: the outer request would read as the inner one's caller (its
    time before the inner one as network); with either provider each is its own trace."""
    if provider == "the host's":
        exporter, tracing = request.getfixturevalue("host_provider_sdk")
    with tt.request(request_id="outer"), tt.request(request_id="inner"):
        pass
    if provider == "the host's":
        assert tracing.force_flush(5_000)
        spans = [s for s in exporter.get_finished_spans() if s.name == sc.SPAN_REQUEST]
    else:
        spans = memory_sdk.spans(sc.SPAN_REQUEST)
    by_id = {s.attributes[sc.REQUEST_ID]: s for s in spans}
    assert by_id["inner"].parent is None
    assert by_id["inner"].context.trace_id != by_id["outer"].context.trace_id


def test_a_wsgi_environ_continues_the_callers_trace(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """PEP 3333 names headers `HTTP_TRACEPARENT`: the environ a WSGI app gets is enough."""
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/v1/completions",
        "HTTP_TRACEPARENT": f"00-{USER_TRACE}-{USER_SPAN}-01",
        "HTTP_TRACESTATE": "vendor=1",
        "wsgi.input": object(),
    }
    with tt.request_from_headers(environ, request_id="w1"):
        pass
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert f"{span.context.trace_id:032x}" == USER_TRACE
    assert f"{span.parent.span_id:016x}" == USER_SPAN
    assert span.context.trace_state.get("vendor") == "1"
