"""OTLP trace payloads (protobuf or JSON) decoded into the analyzer's `Span` records."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tokentrace.analyzer.spans import Span, SpanEvent, SpanLink


class OtlpDecodeError(ValueError):
    """The payload is not a valid OTLP trace export; the message says why."""


_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)
#: A root's parent as older exporters write it (opentelemetry-java and -dotnet before
#: 2021, opentelemetry-cpp, Rust's opentelemetry-otlp in TGI builds): 8 zero bytes where
#: OTLP says empty.  Read as no parent, else the trace would wait for a parent that never
#: comes (`decision_wait_s`) and be flagged root_missing.
_ZERO_SPAN_HEX = "0" * 16
#: Times are stored as BIGINT nanoseconds: a fixed64 beyond this (or a
#: negative JSON time) is not a time, and would fail the whole write it is in.
MAX_NS = 2**63 - 1
#: SpanKind and StatusCode values OTLP defines; the store keeps them in TINYINTs.
MAX_KIND = 5
MAX_STATUS = 2
#: OTLP's counts of what a sender dropped (`dropped_events_count`) are uint32s.
MAX_UINT32 = 2**32 - 1


@dataclass(slots=True)
class Rejected:
    """Spans of an otherwise valid export that were refused (OTLP partial success)."""

    count: int = 0
    message: str = ""

    def add(self, why: str) -> None:
        self.count += 1
        if not self.message:  # the first reason is the one worth reading
            self.message = why

    def __bool__(self) -> bool:
        return self.count > 0


# ---- protobuf ---------------------------------------------------------------
# Per-attribute work dominates decoding, so values are read through one dict
# dispatch on the oneof name; arrays of one scalar type (token offsets: the
# biggest attribute of a request span) take a list comprehension.
_SCALARS = frozenset(("string_value", "int_value", "double_value", "bool_value"))
_GETTERS = {name: attrgetter(name) for name in _SCALARS}


def _any_value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which in _SCALARS:
        return getattr(v, which)
    if which == "array_value":
        return _array(v.array_value.values)
    if which == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(v.bytes_value).decode("ascii")
    return None


def _array(values: Any) -> list[Any]:
    if not values:
        return []
    # OTLP arrays are homogeneous (the spec says so); checking both ends catches
    # the usual violations without a per-element type check on long token arrays
    first = values[0].WhichOneof("value")
    if first in _SCALARS and values[-1].WhichOneof("value") == first:
        return list(map(_GETTERS[first], values))
    return [_any_value(x) for x in values]


def _attrs(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        v = kv.value
        which = v.WhichOneof("value")
        out[kv.key] = getattr(v, which) if which in _SCALARS else _any_value(v)
    return out


# ---- long int arrays (token offsets) straight from the wire ------------------
# upb builds one Python wrapper per array element (~0.13 µs each); a token
# offsets array from an older SDK (today's packs it into one string) has
# ~70-1000 of them on every request span.  Instead the
# arrays of one export are re-serialized (C speed) and their varints decoded
# in one numpy pass.  Only arrays whose every element is exactly
# `AnyValue{int_value}` take this path; anything else falls back to `_array`.

#: Shorter arrays are cheaper through the wrappers than through numpy.
WIRE_ARRAY_MIN = 16
_TAG_ELEMENT = 0x0A  # ArrayValue.values: field 1, length-delimited
_TAG_INT = 0x18  # AnyValue.int_value: field 3, varint


def _attrs_deferring(kvs: Any, deferred: list[tuple[dict[str, Any], str, Any]]) -> dict[str, Any]:
    """`_attrs`, except long int arrays are left for `_fill_int_arrays`."""
    out: dict[str, Any] = {}
    for kv in kvs:
        v = kv.value
        which = v.WhichOneof("value")
        if which in _SCALARS:
            out[kv.key] = getattr(v, which)
        elif which == "array_value":
            values = v.array_value.values
            if len(values) >= WIRE_ARRAY_MIN and values[0].WhichOneof("value") == "int_value":
                out[kv.key] = None  # keeps the attribute order; filled below
                deferred.append((out, kv.key, v.array_value))
            else:
                out[kv.key] = _array(values)
        else:
            out[kv.key] = _any_value(v)
    return out


def decode_int_records(wire: bytes, count: int) -> list[int] | None:
    """Gives the ints of `count` serialized `ArrayValue.values` records that are
    each exactly `AnyValue{int_value: v}` with 0 <= v < 2**63, else None."""
    size = len(wire)
    buf = np.frombuffer(wire + bytes(10), dtype=np.uint8)  # padded: gathers may overrun
    # Each record is 0x0A, L, 0x18, then a varint of L-1 bytes whose bytes all
    # have the high bit set except its last: exactly 4 bytes < 0x80 a record.
    low = np.flatnonzero(buf[:size] < 0x80)
    if count == 0 or len(low) != 4 * count or low[0] != 0 or low[-1] != size - 1:
        return None
    step = np.diff(low)
    step[2::4] = 1  # the varint's own length: any
    if not (step == 1).all():  # records tile the bytes, headers are contiguous
        return None
    header = buf[low].reshape(count, 4)
    tag_at = low[2::4]
    last = low[3::4]
    varint_len = last - tag_at
    if (
        not (header[:, 0] == _TAG_ELEMENT).all()
        or not (header[:, 2] == _TAG_INT).all()
        or not np.array_equal(header[:, 1], varint_len + 1)
    ):
        return None
    longest = int(varint_len.max())
    if longest > 9:  # 10-byte varints are negative int64s: leave them to upb
        return None
    values = header[:, 3].astype(np.int64) << (7 * (varint_len - 1))
    for k in range(longest - 1):
        byte = (buf[tag_at + (1 + k)] & 0x7F).astype(np.int64)
        values |= (byte << (7 * k)) * (varint_len > k + 1)
    return values.tolist()  # type: ignore[no-any-return]


def _fill_int_arrays(deferred: list[tuple[dict[str, Any], str, Any]]) -> None:
    counts = [len(array.values) for _, _, array in deferred]
    wire = b"".join(array.SerializeToString() for _, _, array in deferred)
    flat = decode_int_records(wire, sum(counts))
    if flat is None:  # one odd array: decode them all the general way
        for out, key, array in deferred:
            out[key] = _array(array.values)
        return
    pos = 0
    for (out, key, _), n in zip(deferred, counts, strict=True):
        out[key] = flat[pos : pos + n]
        pos += n


def _out_of_range(start_ns: int, end_ns: int, kind: int, code: int) -> str:
    """Gives why these span fields cannot be stored ("" when they can)."""
    if not (0 <= start_ns <= MAX_NS and 0 <= end_ns <= MAX_NS):
        return f"start and end times must be nanoseconds in 0..2^63-1 (got {start_ns}, {end_ns})"
    if not 0 <= kind <= MAX_KIND:
        return f"kind must be 0..{MAX_KIND}, got {kind}"
    if not 0 <= code <= MAX_STATUS:
        return f"status code must be 0..{MAX_STATUS}, got {code}"
    return ""


def _events(events: Any) -> list[SpanEvent]:
    out = []
    for e in events:
        t = e.time_unix_nano
        if t > MAX_NS:  # a fixed64: never negative
            raise _SpanError(f"event {e.name!r}: time must be nanoseconds in 0..2^63-1, got {t}")
        out.append(SpanEvent(e.name, t, _attrs(e.attributes)))
    return out


class _SpanError(OtlpDecodeError):
    """One span is invalid: it is rejected, the rest of the export is not."""


def decode_protobuf(body: bytes) -> list[Span]:
    """Gives the spans of a protobuf `ExportTraceServiceRequest` (all must be valid)."""
    spans, rejected = decode_protobuf_partial(body)
    if rejected:
        raise OtlpDecodeError(rejected.message)
    return spans


def parse_trace_request(body: bytes) -> ExportTraceServiceRequest:
    """Gives the parsed request, or OtlpDecodeError for bytes that are not one."""
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise OtlpDecodeError(f"invalid OTLP protobuf: {exc}") from exc
    return request


def decode_protobuf_partial(body: bytes) -> tuple[list[Span], Rejected]:
    """Gives the valid spans of a protobuf export and what was rejected."""
    return spans_from_request(parse_trace_request(body))


def spans_from_request(request: ExportTraceServiceRequest) -> tuple[list[Span], Rejected]:
    """Gives the valid spans of an already-parsed request (shared by HTTP and gRPC)."""
    spans: list[Span] = []
    rejected = Rejected()
    append = spans.append
    deferred: list[tuple[dict[str, Any], str, Any]] = []
    # The spans of one trace repeat its trace id and (as parents) their
    # siblings' span ids: one str per distinct id, shared, halves the id
    # memory held in the tail buffer and costs no more than `.hex()` each time.
    hexes: dict[bytes, str] = {}
    for rs in request.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            scope = ss.scope.name
            for ps in ss.spans:
                trace_id = ps.trace_id
                span_id = ps.span_id
                parent = ps.parent_span_id
                if parent == _ZERO_SPAN:
                    parent = b""
                if len(trace_id) != 16 or len(span_id) != 8 or (parent and len(parent) != 8):
                    rejected.add(
                        f"span {ps.name!r}: traceId must be 16 bytes, spanId and "
                        f"parentSpanId 8 (got {len(trace_id)}, {len(span_id)}, {len(parent)})"
                    )
                    continue
                if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
                    rejected.add(f"span {ps.name!r}: traceId and spanId must not be all zeros")
                    continue
                start_ns = ps.start_time_unix_nano
                end_ns = ps.end_time_unix_nano
                kind = ps.kind
                # an unset status is the common case: HasField skips building its wrapper
                code, message = (ps.status.code, ps.status.message) if ps.HasField("status") else (0, "")
                # fixed64 times are never negative; enums may be anything in int32
                if start_ns > MAX_NS or end_ns > MAX_NS or not (
                    0 <= kind <= MAX_KIND and 0 <= code <= MAX_STATUS
                ):
                    rejected.add(f"span {ps.name!r}: {_out_of_range(start_ns, end_ns, kind, code)}")
                    continue
                events = ps.events
                try:
                    span_events = _events(events) if events else []
                except _SpanError as exc:
                    rejected.add(f"span {ps.name!r}: {exc}")
                    continue
                links = ps.links
                attributes = ps.attributes
                trace_hex = hexes.get(trace_id)
                if trace_hex is None:
                    trace_hex = hexes[trace_id] = trace_id.hex()
                span_hex = hexes.get(span_id)
                if span_hex is None:
                    span_hex = hexes[span_id] = span_id.hex()
                parent_hex = ""
                if parent:
                    parent_hex = hexes.get(parent)  # type: ignore[assignment]
                    if parent_hex is None:
                        parent_hex = hexes[parent] = parent.hex()
                append(
                    Span(
                        trace_hex,
                        span_hex,
                        parent_hex,
                        ps.name,
                        kind,
                        start_ns,
                        end_ns,
                        _attrs_deferring(attributes, deferred) if attributes else {},
                        resource,
                        code,
                        message,
                        span_events,
                        [
                            SpanLink(lk.trace_id.hex(), lk.span_id.hex(), _attrs(lk.attributes))
                            for lk in links
                        ]
                        if links
                        else [],
                        scope,
                        # the events the sender's SDK dropped: a client span's chunk events
                        # past its limit (analyzer/conventions/_client_times.py)
                        ps.dropped_events_count,
                    )
                )
    if deferred:
        _fill_int_arrays(deferred)
    return spans, rejected


# ---- JSON (OTLP/JSON: camelCase keys, hex ids, int64 as strings) -------------
# A wrong type anywhere is named by its field: the sender reads the message.
_INT64 = (-(2**63), 2**63 - 1)

# JSON may hold a lone UTF-16 surrogate ("\ud800" is valid JSON; Python's json also
# takes its UTF-8-like bytes), and Python then gives a str that cannot be encoded as
# UTF-8: DuckDB would refuse its row and Prometheus' text format its label.  Every
# string taken from an OTLP/JSON body is repaired (U+FFFD for each lone surrogate);
# the check costs one `isascii()` on the common path.  Protobuf needs none: upb
# refuses a string field that is not valid UTF-8 (`parse_trace_request`: 400).
_SURROGATE = re.compile("[\ud800-\udfff]")


def _repair(text: str) -> str:
    """Gives a non-ASCII `text` with each lone surrogate replaced by U+FFFD."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def _j_str(v: Any) -> str:
    """Gives a JSON value as a str that encodes as UTF-8 (see `_repair`)."""
    if v.__class__ is str:
        return v if v.isascii() else _repair(v)  # type: ignore[no-any-return]
    return str(v)  # not a str: a number, or repr() of a list/object (escapes surrogates)


def _j_obj(v: Any, what: str) -> Mapping[str, Any]:
    """Gives `v` as an object (an absent/null one as empty), or says what is wrong."""
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise OtlpDecodeError(f"{what} must be an object, got {type(v).__name__}")
    return v


def _j_list(v: Any, what: str) -> list[Any]:
    """Gives `v` as a list (an absent/null one as empty), or says what is wrong."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise OtlpDecodeError(f"{what} must be a list, got {type(v).__name__}")
    return v


def _j_value(v: Any) -> Any:
    if not isinstance(v, Mapping):
        raise OtlpDecodeError(f"attribute value must be an object, got {type(v).__name__}")
    if "stringValue" in v:
        text = v["stringValue"]
        # the common case inline: an ASCII str needs no repair
        return text if text.__class__ is str and text.isascii() else _j_str(text)
    if "intValue" in v:
        return _j_int(v["intValue"], "intValue", *_INT64)
    if "doubleValue" in v:
        try:
            return float(v["doubleValue"])
        except (TypeError, ValueError) as exc:
            raise OtlpDecodeError(f"invalid doubleValue {v['doubleValue']!r}") from exc
    if "boolValue" in v:
        b = v["boolValue"]
        if not isinstance(b, bool):  # bool("false") would be True
            raise OtlpDecodeError(f"boolValue must be true or false, got {b!r}")
        return b
    if "arrayValue" in v:
        array = _j_obj(v["arrayValue"], "arrayValue")
        return [_j_value(x) for x in _j_list(array.get("values"), "arrayValue.values")]
    if "kvlistValue" in v:
        return _j_attrs(_j_obj(v["kvlistValue"], "kvlistValue").get("values"))
    if "bytesValue" in v:
        return _j_str(v["bytesValue"])
    return None


def _j_attrs(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in _j_list(kvs, "attributes"):
        if not isinstance(kv, Mapping) or not isinstance(kv.get("key"), str):
            raise OtlpDecodeError("each attribute needs a string key")
        key = kv["key"]
        out[key if key.isascii() else _repair(key)] = _j_value(kv.get("value") or {})
    return out


def _j_int(v: Any, what: str, low: int = 0, high: int = MAX_NS) -> int:
    """Gives an integer field (OTLP/JSON writes int64 as a string) within low..high:
    times are 0..2^63-1 ns, what the store's BIGINT holds."""
    if isinstance(v, bool):  # int(True) is 1: a bool is a wrong type, not a number
        raise OtlpDecodeError(f"{what} must be an integer, got {v!r}")
    try:
        n = int(v)
    except (TypeError, ValueError, OverflowError) as exc:
        raise OtlpDecodeError(f"{what} must be an integer, got {str(v)[:40]!r}") from exc
    if not low <= n <= high:
        raise OtlpDecodeError(f"{what} must be in {low}..{high}, got {n}")
    return n


def _j_id(v: Any, what: str, size: int, required: bool = True) -> str:
    if not v:
        if required:
            raise OtlpDecodeError(f"{what} is required")
        return ""
    if not isinstance(v, str):
        raise OtlpDecodeError(f"{what} must be a hex string")
    try:
        raw = bytes.fromhex(v)
    except ValueError:
        # Some exporters send base64 (protobuf's canonical JSON for bytes).
        try:
            raw = base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise OtlpDecodeError(f"{what} is neither hex nor base64: {v!r}") from exc
    if len(raw) != size:
        raise OtlpDecodeError(f"{what} must be {size} bytes, got {len(raw)}")
    return raw.hex()


def decode_json(doc: Any) -> list[Span]:
    """Gives the spans of an OTLP/JSON export document (already parsed; all must be valid).

    For files (`tokentrace import`): a document without `resourceSpans` is refused, as
    a JSON file that is not an OTLP export most likely is; a receiver takes it as the
    empty export it is (`decode_json_partial`)."""
    if isinstance(doc, Mapping) and "resourceSpans" not in doc and "resource_spans" not in doc:
        raise OtlpDecodeError("OTLP JSON body has no resourceSpans")
    spans, rejected = decode_json_partial(doc)
    if rejected:
        raise OtlpDecodeError(rejected.message)
    return spans


def decode_json_partial(doc: Any) -> tuple[list[Span], Rejected]:
    """Gives the valid spans of an OTLP/JSON export document and what was rejected.
    `{}` is an export without spans (proto3 JSON leaves out empty fields): none, and
    nothing rejected."""
    try:
        return _decode_json(doc)
    except (AttributeError, TypeError, RecursionError) as exc:  # a wrong type deep in the body
        raise OtlpDecodeError(f"invalid OTLP JSON structure: {exc}") from exc


def parse_json_body(body: bytes) -> Any:
    """Gives the parsed JSON of a request body, or OtlpDecodeError saying why it is none."""
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise OtlpDecodeError(f"invalid JSON: {exc}") from exc


def decode_json_body(body: bytes) -> tuple[list[Span], Rejected]:
    """Gives the valid spans of an OTLP/JSON request body and what was rejected."""
    return decode_json_partial(parse_json_body(body))


def _decode_json(doc: Any) -> tuple[list[Span], Rejected]:
    if not isinstance(doc, Mapping):
        raise OtlpDecodeError("OTLP JSON body must be an object with resourceSpans")
    resource_spans = doc.get("resourceSpans", doc.get("resource_spans"))
    if resource_spans is None:  # an empty export request
        return [], Rejected()
    if not isinstance(resource_spans, list):
        raise OtlpDecodeError("resourceSpans must be a list")
    spans: list[Span] = []
    rejected = Rejected()
    for rs in resource_spans:
        if not isinstance(rs, Mapping):
            raise OtlpDecodeError("each resourceSpans entry must be an object")
        resource = _j_attrs(_j_obj(rs.get("resource"), "resource").get("attributes"))
        scope_spans = rs.get("scopeSpans", rs.get("scope_spans"))
        for ss in _j_list(scope_spans, "scopeSpans"):
            ss = _j_obj(ss, "each scopeSpans entry")
            scope = _j_str(_j_obj(ss.get("scope"), "scope").get("name", ""))
            for ps in _j_list(ss.get("spans"), "spans"):
                if not isinstance(ps, Mapping):
                    raise OtlpDecodeError("each span must be an object")
                try:
                    spans.append(_j_span(ps, resource, scope))
                except (OtlpDecodeError, AttributeError, TypeError) as exc:
                    rejected.add(f"span {str(ps.get('name', ''))[:100]!r}: {exc}")
    return spans, rejected


def _j_span(ps: Mapping[str, Any], resource: dict[str, Any], scope: str) -> Span:
    status = _j_obj(ps.get("status"), "status")
    trace_id = _j_id(ps.get("traceId"), "traceId", 16)
    span_id = _j_id(ps.get("spanId"), "spanId", 8)
    if not trace_id.strip("0") or not span_id.strip("0"):
        raise OtlpDecodeError("traceId and spanId must not be all zeros")
    parent = _j_id(ps.get("parentSpanId"), "parentSpanId", 8, False)
    return (
        Span(
            trace_id=trace_id,
            span_id=span_id,
            parent_span_id="" if parent == _ZERO_SPAN_HEX else parent,
            name=_j_str(ps.get("name", "")),
            kind=_j_int(ps.get("kind", 0), "kind", 0, MAX_KIND),
            start_ns=_j_int(ps.get("startTimeUnixNano", 0), "startTimeUnixNano"),
            end_ns=_j_int(ps.get("endTimeUnixNano", 0), "endTimeUnixNano"),
            attributes=_j_attrs(ps.get("attributes")),
            resource=resource,
            status_code=_j_int(status.get("code", 0), "status.code", 0, MAX_STATUS),
            status_message=_j_str(status.get("message", "")),
            events=[
                SpanEvent(
                    _j_str(e.get("name", "")),
                    _j_int(e.get("timeUnixNano", 0), "event timeUnixNano"),
                    _j_attrs(e.get("attributes")),
                )
                for e in map(_j_obj, _j_list(ps.get("events"), "events"), repeat("each event"))
            ],
            links=[
                SpanLink(
                    _j_id(lk.get("traceId"), "link traceId", 16),
                    _j_id(lk.get("spanId"), "link spanId", 8),
                    _j_attrs(lk.get("attributes")),
                )
                for lk in map(_j_obj, _j_list(ps.get("links"), "links"), repeat("each link"))
            ],
            scope=scope,
            dropped_events_count=_j_int(
                ps.get("droppedEventsCount") or 0, "droppedEventsCount", 0, MAX_UINT32
            ),
        )
    )
