"""The events a sender's SDK dropped (`dropped_events_count`) reach the analyzer's `Span` on
every decoding path: protobuf, OTLP/JSON, and a decode worker's packed traces.  The spans
come from the real OpenTelemetry SDK past its event limit, which drops the oldest events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tokentrace.analyzer.spans import Span
from tokentrace.collector.decode_pool import decode_export, unpack
from tokentrace.collector.otlp import decode_json, decode_protobuf

CHUNK = "gen_ai.content.completion.chunk"
LIMIT, CHUNKS = 8, 20


@pytest.fixture(scope="module")
def exported() -> Iterator[list[ReadableSpan]]:
    """A client span of 20 chunk events under an event limit of 8, and one within it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_events=LIMIT))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("openai.chat", kind=SpanKind.CLIENT) as client:
        for i in range(CHUNKS):
            client.add_event(CHUNK, {"chunk": i})
        with tracer.start_as_current_span("POST", kind=SpanKind.CLIENT) as post:
            post.add_event("sent")
    spans = list(exporter.get_finished_spans())
    provider.shutdown()
    yield spans


def _protobuf(spans: list[ReadableSpan]) -> list[Span]:
    return decode_protobuf(encode_spans(spans).SerializeToString())


def _json(spans: list[ReadableSpan]) -> list[Span]:
    # protobuf's JSON mapping as OTLP/JSON asks (enums as integers; ids here in base64)
    return decode_json(MessageToDict(encode_spans(spans), use_integers_for_enums=True))


def _packed(spans: list[ReadableSpan]) -> list[Span]:
    wire, rejected, _ = decode_export(encode_spans(spans).SerializeToString())
    assert not rejected
    return [x for trace in unpack(wire) for x in trace.spans()]


@pytest.mark.parametrize("decode", [_protobuf, _json, _packed], ids=["protobuf", "json", "packed"])
def test_dropped_events_count_is_decoded(
    exported: list[ReadableSpan], decode: Callable[[Any], list[Span]]
) -> None:
    by_name = {x.name: x for x in decode(exported)}
    client, post = by_name["openai.chat"], by_name["POST"]
    assert client.dropped_events_count == CHUNKS - LIMIT
    # the SDK kept the newest: the first chunks are the ones missing
    assert [e.attributes["chunk"] for e in client.events] == list(range(CHUNKS - LIMIT, CHUNKS))
    assert post.dropped_events_count == 0 and len(post.events) == 1


def test_a_packed_trace_summarizes_as_decoded(exported: list[ReadableSpan]) -> None:
    # the worker's summary sees the count too: no first token read from a cut list
    wire, _, _ = decode_export(encode_spans(exported).SerializeToString())
    (trace,) = unpack(wire)
    assert trace.pre is not None
    (row,) = trace.pre.requests
    assert row.ttft_client_ms is None and "client_events_dropped" in row.flags
