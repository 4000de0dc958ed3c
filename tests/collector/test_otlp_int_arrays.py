"""Long int arrays (token offsets) decoded from the wire give exactly what the
per-element upb path gives, and anything that is not a plain int array falls back."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue

from tokentrace.collector import otlp

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
ELEMENT = st.one_of(
    INT64.map(lambda v: AnyValue(int_value=v)),
    st.just(AnyValue()),  # no value set
    st.text(max_size=3).map(lambda v: AnyValue(string_value=v)),
    st.floats(allow_nan=False).map(lambda v: AnyValue(double_value=v)),
)


def _export(arrays: list[list[AnyValue]]) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    spans = req.resource_spans.add().scope_spans.add().spans
    for i, values in enumerate(arrays):
        span = spans.add(trace_id=bytes(15) + b"\x01", span_id=(i + 1).to_bytes(8, "big"), name="s")
        kv = span.attributes.add(key="tokentrace.token.offsets_us")
        kv.value.array_value.CopyFrom(ArrayValue(values=values))
        span.attributes.add(key="after").value.int_value = i
    return req


def _per_element(req: ExportTraceServiceRequest) -> list[dict[str, object]]:
    return [
        otlp._attrs(span.attributes)  # the general path, one upb wrapper per element
        for span in req.resource_spans[0].scope_spans[0].spans
    ]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(min_value=0, max_value=2**63 - 1), max_size=80), max_size=6))
def test_plain_int_arrays_match_the_upb_path(arrays: list[list[int]]) -> None:
    req = _export([[AnyValue(int_value=v) for v in a] for a in arrays])
    spans, rejected = otlp.spans_from_request(req)
    assert not rejected
    assert [s.attributes for s in spans] == _per_element(req)
    assert [s.attributes["tokentrace.token.offsets_us"] for s in spans] == arrays
    assert all(list(s.attributes) == ["tokentrace.token.offsets_us", "after"] for s in spans)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(ELEMENT, min_size=otlp.WIRE_ARRAY_MIN, max_size=40), min_size=1, max_size=4))
def test_odd_arrays_fall_back_to_the_same_values(arrays: list[list[AnyValue]]) -> None:
    # negatives (10-byte varints), unset values and mixed types in the middle
    req = _export([[AnyValue(int_value=7), *a] for a in arrays])
    spans, _ = otlp.spans_from_request(req)
    assert [s.attributes for s in spans] == _per_element(req)


def test_wire_decoder_refuses_what_is_not_int_records() -> None:
    good = ArrayValue(values=[AnyValue(int_value=v) for v in (0, 1, 127, 128, 2**40)])
    assert otlp.decode_int_records(good.SerializeToString(), 5) == [0, 1, 127, 128, 2**40]
    assert otlp.decode_int_records(good.SerializeToString(), 4) is None  # count mismatch
    assert otlp.decode_int_records(good.SerializeToString()[:-1], 5) is None  # truncated
    negative = ArrayValue(values=[AnyValue(int_value=-1)])
    assert otlp.decode_int_records(negative.SerializeToString(), 1) is None
    doubles = ArrayValue(values=[AnyValue(double_value=1.0)])
    assert otlp.decode_int_records(doubles.SerializeToString(), 1) is None
    assert otlp.decode_int_records(b"", 0) is None
