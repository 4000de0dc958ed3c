"""Builders of tokentrace-convention request traces, as Span records and as OTLP."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from tokentrace.analyzer.spans import KIND_INTERNAL, KIND_SERVER, STATUS_ERROR, Span
from tokentrace.instrumentation import semconv as sc

T0 = 1_700_000_000_000_000_000


def new_id(n: int) -> str:
    return os.urandom(n).hex()


def request_trace(
    trace_id: str | None = None,
    *,
    ttft_ms: float = 50.0,
    tokens: int = 10,
    itl_ms: float = 5.0,
    queue_ms: float = 5.0,
    error: bool = False,
    parent_span_id: str = "",
    model: str = "m",
    route: str = "/v1/chat",
    service: str = "svc",
    attributes: dict[str, Any] | None = None,
    start_ns: int = T0,
    packed: bool = True,
) -> list[Span]:
    """Gives the ~6 spans of one request as the SDK emits them (`packed`: token
    times as one JSON string, as today's SDK sends them; else an int array)."""
    trace_id = trace_id or new_id(16)
    resource = {sc.SERVICE_NAME: service, sc.SERVICE_INSTANCE: "i-1"}
    root_id = new_id(8)
    ms = 1_000_000
    tok_ns = int(1 * ms)
    q_start = start_ns + tok_ns
    pre_start = q_start + int(queue_ms * ms)
    first_tok = start_ns + int(ttft_ms * ms)
    offsets = [int((first_tok - start_ns) / 1000 + i * itl_ms * 1000) for i in range(tokens)]
    end = start_ns + offsets[-1] * 1000 + ms
    attrs = {
        sc.REQUEST_MODEL: model,
        sc.ROUTE: route,
        sc.TOKEN_OFFSETS_US: sc.pack_list(offsets) if packed else offsets,
        sc.OUTPUT_TOKENS: tokens,
        sc.PROMPT_TOKENS: 12,
        sc.REQUEST_ID: f"req-{trace_id[:8]}",
        **(attributes or {}),
    }
    root = Span(
        trace_id, root_id, parent_span_id, sc.SPAN_REQUEST, KIND_SERVER, start_ns, end,
        attrs, resource, STATUS_ERROR if error else 0,
    )  # fmt: skip

    def child(name: str, a: int, b: int) -> Span:
        return Span(trace_id, new_id(8), root_id, name, KIND_INTERNAL, a, b, {}, resource)

    return [
        child(sc.SPAN_TOKENIZE, start_ns, q_start),
        child(sc.SPAN_QUEUE, q_start, pre_start),
        child(sc.SPAN_PREFILL, pre_start, first_tok),
        child(sc.SPAN_DECODE, first_tok, start_ns + offsets[-1] * 1000),
        child(sc.SPAN_DETOKENIZE, end - ms // 2, end),
        root,
    ]


def _value(v: Any) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, list):
        out = AnyValue()
        out.array_value.values.extend(_value(x) for x in v)
        return out
    return AnyValue(string_value=str(v))


def _kvs(d: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=_value(v)) for k, v in d.items()]


def to_protobuf(spans: Sequence[Span]) -> ExportTraceServiceRequest:
    """Gives an OTLP export of the spans (one resource, as an exporter sends them)."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    if spans:
        rs.resource.attributes.extend(_kvs(spans[0].resource))
    ss = rs.scope_spans.add()
    ss.scope.name = "tokentrace"
    for s in spans:
        ps = ss.spans.add()
        ps.trace_id = bytes.fromhex(s.trace_id)
        ps.span_id = bytes.fromhex(s.span_id)
        if s.parent_span_id:
            ps.parent_span_id = bytes.fromhex(s.parent_span_id)
        ps.name = s.name
        ps.kind = PbSpan.SpanKind.ValueType(s.kind)
        ps.start_time_unix_nano = s.start_ns
        ps.end_time_unix_nano = s.end_ns
        ps.attributes.extend(_kvs(s.attributes))
        ps.status.code = s.status_code  # type: ignore[assignment]
    return req


def to_json(spans: Sequence[Span]) -> dict[str, Any]:
    """Gives the OTLP/JSON form (hex ids, int64 as strings) of the spans."""

    def jv(v: Any) -> dict[str, Any]:
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        if isinstance(v, float):
            return {"doubleValue": v}
        if isinstance(v, list):
            return {"arrayValue": {"values": [jv(x) for x in v]}}
        return {"stringValue": str(v)}

    def attrs(d: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"key": k, "value": jv(v)} for k, v in d.items()]

    return {
        "resourceSpans": [
            {
                "resource": {"attributes": attrs(spans[0].resource if spans else {})},
                "scopeSpans": [
                    {
                        "scope": {"name": "tokentrace"},
                        "spans": [
                            {
                                "traceId": s.trace_id,
                                "spanId": s.span_id,
                                "parentSpanId": s.parent_span_id,
                                "name": s.name,
                                "kind": s.kind,
                                "startTimeUnixNano": str(s.start_ns),
                                "endTimeUnixNano": str(s.end_ns),
                                "attributes": attrs(s.attributes),
                                "status": {"code": s.status_code},
                            }
                            for s in spans
                        ],
                    }
                ],
            }
        ]
    }
