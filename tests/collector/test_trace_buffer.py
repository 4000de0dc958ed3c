"""The tail buffer (`collector/trace_buffer.py`): its bounds, its high and low water
marks, and what a trace is reckoned to weigh."""

from __future__ import annotations

import pytest
from otlp_traces import request_trace

from tokentrace.collector.trace_buffer import (
    SPAN_BYTES,
    PendingTrace,
    TraceBuffer,
    spans_bytes,
)


def _fill(buffer: TraceBuffer, traces: range, spans: int = 10, nbytes: int = 0) -> None:
    """Buffers traces t<i> of `spans` spans and `nbytes` each, as the receive loop does."""
    for i in traces:
        buffer.pending[f"t{i}"] = PendingTrace(request_trace()[:1] * spans, i, None, nbytes)
        buffer.spans += spans
        buffer.bytes += nbytes


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_buffered_spans"):
        TraceBuffer(0, 1)
    with pytest.raises(ValueError, match="max_buffered_bytes"):
        TraceBuffer(1, 0)


def test_an_empty_buffer_takes_any_batch_a_full_one_says_which_bound() -> None:
    buffer = TraceBuffer(max_spans=100, max_bytes=1000)
    assert buffer.has_room(500, 10_000)  # one big export always makes progress
    _fill(buffer, range(1), spans=10, nbytes=100)
    assert buffer.has_room(90, 900)
    assert not buffer.has_room(91, 0) and not buffer.full_of_bytes
    assert not buffer.has_room(1, 901) and buffer.full_of_bytes


def test_past_high_water_the_oldest_go_until_low_water() -> None:
    buffer = TraceBuffer(max_spans=100, max_bytes=10**9)
    _fill(buffer, range(9))  # 90 spans: at 90 %, not past it
    assert list(buffer.overflow()) == []
    _fill(buffer, range(9, 10))
    taken = []
    for trace_id in buffer.overflow():
        taken.append(trace_id)
        buffer.take(trace_id)
    assert taken == ["t0", "t1", "t2"]  # 100 -> 70 spans, under 75
    assert buffer.spans == 70


def test_a_span_weighs_its_strings_beyond_a_fixed_part() -> None:
    spans = request_trace()
    before = spans_bytes(spans)
    assert min(before) > SPAN_BYTES
    spans[1].name += "x" * 1000
    spans[2].attributes["prompt"] = "y" * 5000
    spans[3].attributes["prompt"] = "\u4e2d" * 5000  # a long non-ASCII string: 4 bytes a character
    after = spans_bytes(spans)
    assert [a - b for a, b in zip(after, before, strict=True)][1:4] == [1000, 5000, 20_000]
