"""Request ids with "," or "%" survive an engine step's id list (joined by ",")."""

from __future__ import annotations

import time

import pytest

from tokentrace import instrumentation as tt
from tokentrace.analyzer.engine_steps import extract_engine_steps
from tokentrace.collector.otlp import decode_protobuf
from tokentrace.instrumentation import semconv as sc

ODD_IDS = ["a,b", "c", "50%", "%2C", "x%252Cy", "plain"]


def _steps(memory_sdk):  # type: ignore[no-untyped-def]
    memory_sdk.spans(sc.SPAN_ENGINE_STEPS)  # flushed
    return extract_engine_steps(decode_protobuf(memory_sdk.otlp_bytes()))


@pytest.mark.parametrize("how", ["engine_step", "record_step", "record_step ints"])
def test_ids_with_separators_come_back_whole(memory_sdk, how: str) -> None:  # type: ignore[no-untyped-def]
    ids: list = [7, "a,b", 0] if how == "record_step ints" else ODD_IDS
    if how == "engine_step":
        with tt.engine_step() as step:
            for rid in ids:
                step.decode(rid)
    else:
        now = time.time_ns()
        tt.record_step(start_ns=now, end_ns=now + 1000, prefill_tokens=0,
                       decode_seqs=len(ids), batch_size=len(ids), queue_depth=0,
                       request_ids=ids)  # fmt: skip
    (step,) = _steps(memory_sdk)
    assert step.request_ids == [str(rid) for rid in ids]
    assert step.batch_size == len(ids)


def test_plain_ids_are_sent_as_they_are(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    with tt.engine_step() as step:
        step.decode("cmpl-1")
        step.decode("cmpl-2")
    (span,) = memory_sdk.spans(sc.SPAN_ENGINE_STEPS)
    assert sc.unpack_list(span.attributes[sc.STEP_REQUEST_IDS]) == ["cmpl-1,cmpl-2"]


def test_one_string_is_ids_already_joined(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    now = time.time_ns()
    tt.record_step(start_ns=now, end_ns=now + 1000, prefill_tokens=0, decode_seqs=2,
                   batch_size=2, queue_depth=0, request_ids="r1,r2%")  # fmt: skip
    (step,) = _steps(memory_sdk)
    assert step.request_ids == ["r1", "r2%"]
