"""Engine steps: appends, flushed as `tokentrace.engine.steps` spans the analyzer unpacks and serve stores."""

from __future__ import annotations

import time

from tokentrace import instrumentation as tt
from tokentrace.analyzer.engine_steps import extract_engine_steps
from tokentrace.collector.otlp import decode_protobuf
from tokentrace.instrumentation import _steps
from tokentrace.instrumentation import semconv as sc

#: a wall-clock time in `time.time_ns()` nanoseconds, as step times are
T0 = 1_700_000_000_000_000_000


def _run_steps() -> None:
    with tt.engine_step(queue_depth=3, kv_usage=0.25) as step:
        step.prefill("req-a", 17)
        step.prefill("req-a", 5)  # a chunked prefill lists one request twice
        step.decode("req-b")
        time.sleep(0.002)
    with tt.engine_step(queue_depth=2) as step:
        step.decode("req-a")
        step.decode("req-b")
    now = time.time_ns()
    tt.record_step(
        start_ns=now,
        end_ns=now + 3_000_000,
        prefill_tokens=0,
        decode_seqs=1,
        batch_size=1,
        queue_depth=0,
        request_ids=["req-b"],
        gpu_us=1234,
    )


def test_steps_become_one_root_span_the_analyzer_unpacks(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    with tt.request(request_id="outer"):
        _run_steps()  # steps inside a request still go to their own trace
    spans = memory_sdk.spans(sc.SPAN_ENGINE_STEPS)
    assert len(spans) == 1
    span = spans[0]
    assert span.parent is None
    req = memory_sdk.spans(sc.SPAN_REQUEST)[0]
    assert span.context.trace_id != req.context.trace_id
    assert span.resource.attributes["service.name"] == "sdk-test"
    assert span.attributes[sc.STEP_COUNT] == 3
    unforwarded = sc.unpack_list(span.attributes[sc.STEP_FORWARD_HOST_US])
    assert unforwarded == [-1, -1, -1]  # no timed forward ran

    steps = extract_engine_steps(decode_protobuf(memory_sdk.otlp_bytes()))
    assert len(steps) == 3
    first, second, third = steps
    assert (first.prefill_tokens, first.decode_seqs, first.batch_size, first.queue_depth) == (
        22,
        1,
        2,
        3,
    )
    assert first.request_ids == ["req-a", "req-b"]
    assert first.kv_usage == 0.25 and first.gpu_us is None
    assert first.duration_us >= 2000
    assert first.service == "sdk-test"
    assert (second.decode_seqs, second.batch_size, second.kv_usage) == (2, 2, None)
    assert second.start_ns >= first.start_ns + first.duration_us * 1000
    assert (third.gpu_us, third.request_ids, third.duration_us) == (1234, ["req-b"], 3000)

    # every per-step list goes packed: one JSON string, not an OTLP array of values
    step_lists = {k for k in sc.PACKED_LISTS if k.startswith("tokentrace.step.")}
    assert step_lists <= span.attributes.keys()
    assert all(isinstance(span.attributes[k], str) for k in step_lists)
    # an older SDK's arrays give the same steps
    arrays = decode_protobuf(memory_sdk.otlp_bytes())
    for decoded in arrays:
        for key in step_lists & decoded.attributes.keys():
            decoded.attributes[key] = sc.unpack_list(decoded.attributes[key])
    assert extract_engine_steps(arrays) == steps


def test_flusher_thread_emits_without_an_explicit_flush(memory_sdk, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    recorder = _steps.StepRecorder(flush_interval_s=0.05)
    monkeypatch.setattr(_steps, "recorder", recorder)
    _run_steps()
    deadline = time.monotonic() + 30
    while (recorder.emitted_spans == 0 or recorder._items) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert recorder.emitted_spans >= 1  # emitted by its thread: nothing here flushed it
    # one span of the 3 steps, or more where the thread's tick fell between two of them (a
    # loaded machine's pause in `_run_steps` made that 2 spans: 2 steps, then 1)
    spans = memory_sdk.spans(sc.SPAN_ENGINE_STEPS)
    assert len(spans) == recorder.emitted_spans
    assert sum(s.attributes[sc.STEP_COUNT] for s in spans) == 3


def test_bounded_buffer_drops_oldest_and_says_so(memory_sdk, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    recorder = _steps.StepRecorder(flush_interval_s=60, max_pending=4)
    monkeypatch.setattr(_steps, "recorder", recorder)
    for i in range(10):
        tt.record_step(start_ns=T0 + i * 1000, end_ns=T0 + i * 1000 + 500, prefill_tokens=i, decode_seqs=0,
                       batch_size=1, queue_depth=0)  # fmt: skip
    assert recorder.flush() == 4
    span = memory_sdk.spans(sc.SPAN_ENGINE_STEPS)[0]
    assert sc.unpack_list(span.attributes[sc.STEP_PREFILL_TOKENS]) == [6, 7, 8, 9]
    assert span.attributes[sc.STEP_DROPPED] == 6


def test_serve_stores_engine_steps(serve_sdk) -> None:  # type: ignore[no-untyped-def]
    serve, tracing = serve_sdk
    _run_steps()
    assert tracing.force_flush(10_000)
    serve.stop()
    rows = serve.rows(
        "SELECT service, prefill_tokens, decode_seqs, batch_size, queue_depth, kv_usage, gpu_us, request_ids "
        "FROM engine_steps ORDER BY start_ns"
    )
    assert rows == [
        ("sdk-e2e", 22, 1, 2, 3, 0.25, None, ["req-a", "req-b"]),
        ("sdk-e2e", 0, 2, 2, 2, None, None, ["req-a", "req-b"]),
        ("sdk-e2e", 0, 1, 1, 0, None, 1234, ["req-b"]),
    ]


def test_serve_stores_a_steps_forward_host_time(serve_sdk) -> None:  # type: ignore[no-untyped-def]
    # the SDK always sent it; the collector dropped it, losing the host side of
    # "GPU time vs host time" per step (on CPU there is no GPU time: NULL)
    serve, tracing = serve_sdk
    forward = tt.instrument_model(lambda: time.sleep(0.003), "decode")
    with tt.engine_step() as step:
        step.decode("req-f")
        forward()
    with tt.engine_step() as step:  # no timed forward in it
        step.decode("req-g")
    assert tracing.force_flush(10_000)
    serve.stop()
    rows = serve.rows(
        "SELECT request_ids, forward_host_us, gpu_us FROM engine_steps ORDER BY start_ns"
    )
    assert [r[0] for r in rows] == [["req-f"], ["req-g"]]
    assert rows[0][1] >= 3000 and rows[0][2] is None
    assert rows[1][1:] == (None, None)


def test_a_count_the_engine_does_not_give_is_unknown_not_zero(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    with tt.engine_step(decode=["req-a"]):  # no queue_depth: the engine did not say
        pass
    tt.record_step(start_ns=T0, end_ns=T0 + 1000, prefill_tokens=None, decode_seqs=None,
                   batch_size=None, queue_depth=None, request_ids=["req-b"])  # fmt: skip
    span = memory_sdk.spans(sc.SPAN_ENGINE_STEPS)[0]
    assert sc.unpack_list(span.attributes[sc.STEP_QUEUE_DEPTH]) == [-1, -1]
    first, second = extract_engine_steps(decode_protobuf(memory_sdk.otlp_bytes()))
    # what the step itself counted is known; what nobody gave is None, stored as NULL
    assert (first.prefill_tokens, first.decode_seqs, first.batch_size) == (0, 1, 1)
    assert first.queue_depth is None
    assert (second.prefill_tokens, second.decode_seqs, second.batch_size) == (None, None, None)
    assert second.queue_depth is None
