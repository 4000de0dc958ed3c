"""Engine-step spans stay a size OTLP receivers take, however big the batches."""

from __future__ import annotations

import time

from tokentrace import instrumentation as tt
from tokentrace.analyzer.engine_steps import extract_engine_steps
from tokentrace.collector.otlp import decode_protobuf
from tokentrace.instrumentation import _steps
from tokentrace.instrumentation import semconv as sc

STEPS = 512
SEQS = 256


def test_big_batches_split_into_spans_under_the_id_cap(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """512 steps of 256 sequences with UUID-like ids: ~4.8 MB of ids in one span before."""
    ids = [f"cmpl-{i:032x}" for i in range(SEQS)]
    now = time.time_ns()
    for step in range(STEPS):
        tt.record_step(
            start_ns=now + step * 1_000_000,
            end_ns=now + step * 1_000_000 + 900_000,
            prefill_tokens=0,
            decode_seqs=SEQS,
            batch_size=SEQS,
            queue_depth=0,
            request_ids=ids,
        )
    spans = memory_sdk.spans(sc.SPAN_ENGINE_STEPS)
    assert len(spans) > 1
    for span in spans:
        assert len(span.attributes[sc.STEP_REQUEST_IDS]) <= _steps.MAX_SPAN_REQUEST_ID_CHARS + 1024
    assert sum(span.attributes[sc.STEP_COUNT] for span in spans) == STEPS
    # nothing lost in the split: every step, in order, with all of its requests
    steps = extract_engine_steps(decode_protobuf(memory_sdk.otlp_bytes()))
    assert len(steps) == STEPS
    assert sorted(s.start_ns for s in steps) == [now + i * 1_000_000 for i in range(STEPS)]
    assert all(s.batch_size == SEQS for s in steps)


def test_small_batches_stay_one_span(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    now = time.time_ns()
    for step in range(100):
        tt.record_step(start_ns=now + step * 1_000, end_ns=now + step * 1_000 + 500,
                       prefill_tokens=0, decode_seqs=2, batch_size=2, queue_depth=0,
                       request_ids=["a", "b"])  # fmt: skip
    (span,) = memory_sdk.spans(sc.SPAN_ENGINE_STEPS)
    assert span.attributes[sc.STEP_COUNT] == 100
