"""Packed lists: the SDK's token times as one JSON string read the same as an OTLP
int array (older SDKs), over both OTLP encodings; a packed list cut short by an
attribute length limit loses its token times, not the request, and says so."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from otlp_traces import request_trace, to_json, to_protobuf

from tokentrace.analyzer import spans as spans_module
from tokentrace.analyzer import summary as s
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import Span
from tokentrace.collector.otlp import decode_json, decode_protobuf
from tokentrace.instrumentation import semconv as sc


def _over_the_wire(spans: list[Span], encoding: str) -> list[Span]:
    if encoding == "protobuf":
        return decode_protobuf(to_protobuf(spans).SerializeToString())
    return decode_json(to_json(spans))


def _request(spans: list[Span]) -> s.RequestSummary:
    (summary,) = summarize_trace(spans).requests
    return summary


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_packed_and_array_token_times_give_the_same_request(encoding: str) -> None:
    packed = request_trace("ab" * 16, ttft_ms=80, tokens=40, itl_ms=7, packed=True)
    array = request_trace("ab" * 16, ttft_ms=80, tokens=40, itl_ms=7, packed=False)
    root = next(sp for sp in packed if sp.name == sc.SPAN_REQUEST)
    assert isinstance(root.attributes[sc.TOKEN_OFFSETS_US], str)  # the test sends both forms

    from_packed = _request(_over_the_wire(packed, encoding))
    from_array = _request(_over_the_wire(array, encoding))
    assert dataclasses.asdict(from_packed) == dataclasses.asdict(from_array)
    assert from_packed.output_tokens == 40
    assert from_packed.ttft_ms == pytest.approx(80, abs=0.01)
    assert from_packed.itl_p50_ms == pytest.approx(7, abs=0.01)
    assert s.FLAG_NO_TOKEN_TIMES not in from_packed.flags


def test_a_packed_list_cut_short_loses_the_token_times_not_the_request(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spans_module, "_warned", set())  # not yet said in this process
    spans = request_trace("cd" * 16, ttft_ms=80, tokens=40, itl_ms=7)
    root = next(sp for sp in spans if sp.name == sc.SPAN_REQUEST)
    whole = root.attributes[sc.TOKEN_OFFSETS_US]
    root.attributes[sc.TOKEN_OFFSETS_US] = whole[:25]  # as a 25-character value limit leaves it

    with caplog.at_level(logging.WARNING, logger="tokentrace.analyzer"):
        summary = _request(decode_protobuf(to_protobuf(spans).SerializeToString()))
        _request(spans)  # said once per attribute name, not once per request
    assert s.FLAG_NO_TOKEN_TIMES in summary.flags
    assert summary.itl_p50_ms is None
    assert summary.server_ms is not None and summary.server_ms > 0  # the rest of the request stays
    (said,) = [r.getMessage() for r in caplog.records if sc.TOKEN_OFFSETS_US in r.getMessage()]
    assert "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT" in said
