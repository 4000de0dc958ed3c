"""The OTLP recorder: what the real OpenTelemetry SDK exports over HTTP and gRPC is kept
byte-exact, and its JSON line reads back, through tokentrace's file reader, as the spans
tokentrace decodes from the protobuf itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from otlp_recorder import OtlpRecorder, from_otlp_json, json_line, to_otlp_json

from tokentrace.collector.otlp import decode_protobuf
from tokentrace.collector.otlp_file import read_otlp_file


@pytest.fixture
def recorder() -> Iterator[OtlpRecorder]:
    with OtlpRecorder() as rec:
        yield rec


def _export_spans(transport: str, rec: OtlpRecorder) -> None:
    """Sends a small trace with every kind of field through the real SDK exporter."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode

    if transport == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=rec.grpc_endpoint, insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        exporter = HttpExporter(endpoint=f"{rec.http_endpoint}/v1/traces")
    provider = TracerProvider(
        resource=Resource.create({"service.name": "recorder-test"}),
        span_limits=SpanLimits(max_events=4),  # so the export counts dropped events
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("recorder-test")
    try:
        with tracer.start_as_current_span("outer", kind=SpanKind.CLIENT) as outer:
            outer.set_attributes({"n": 3, "f": 0.25, "b": True, "s": "x", "l": [1, 2]})
            for i in range(6):
                outer.add_event("gen_ai.content.completion.chunk", {"i": i})
            with tracer.start_as_current_span(
                "inner", kind=SpanKind.SERVER, links=[Link(outer.get_span_context())]
            ) as inner:
                inner.set_status(Status(StatusCode.ERROR, "boom"))
    finally:
        provider.shutdown()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_recorded_export_reads_back_as_sent(
    transport: str, recorder: OtlpRecorder, tmp_path: Path
) -> None:
    _export_spans(transport, recorder)
    exports = recorder.take()
    assert [e.transport for e in exports] == [transport, transport]  # one export a span
    for export in exports:
        assert from_otlp_json(to_otlp_json(export.body)) == export.body
    path = tmp_path / "trace.jsonl"
    assert recorder.write(path, exports) == 2

    from_file = read_otlp_file(path)
    from_wire = [span for e in exports for span in decode_protobuf(e.body)]
    assert from_file == from_wire
    assert {s.name for s in from_file} == {"outer", "inner"}
    outer = next(s for s in from_file if s.name == "outer")
    assert len(outer.events) == 4  # the SDK kept the last 4 of 6
    line = path.read_text().splitlines()[1]
    assert '"droppedEventsCount":2' in line
    # the specification's JSON: hex ids, enums as numbers
    assert f'"traceId":"{outer.trace_id}"' in line
    assert '"kind":3' in line


def test_take_gives_each_export_once(recorder: OtlpRecorder) -> None:
    _export_spans("http", recorder)
    assert len(recorder.take()) == 2
    assert recorder.take() == []
    assert recorder.wait_quiet(0.05, timeout_s=5)


def test_a_line_that_would_lose_bytes_is_refused() -> None:
    from otlp_recorder import Export

    from tokentrace.collector.otlp import parse_trace_request

    with OtlpRecorder() as rec:
        _export_spans("http", rec)
        body = rec.take()[0].body
    assert parse_trace_request(body).resource_spans
    # an unknown field (number 99, varint 1): protobuf keeps it, JSON cannot carry it
    with pytest.raises(ValueError, match="round-trip"):
        json_line(Export("http", 0, body + b"\x98\x06\x01"))
