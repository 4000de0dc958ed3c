"""A request marked from two threads at once: an engine thread ending a phase or recording
tokens while a handler finishes it, and flushes that run while requests keep finishing."""

from __future__ import annotations

import threading
import time

import pytest

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _request, _steps
from tokentrace.instrumentation import semconv as sc


def _phases(memory_sdk, request_span) -> dict[str, list]:  # type: ignore[no-untyped-def]
    """The request's phase spans by phase name."""
    out: dict[str, list] = {}
    for span in memory_sdk.exporter.get_finished_spans():
        if span.parent is not None and span.parent.span_id == request_span.context.span_id:
            out.setdefault(span.name, []).append(span)
    return out


@pytest.mark.slow
def test_a_phase_ended_while_another_thread_finishes_is_kept_once(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """The handler's finish() lands right after end_phase took the phase out of the open
    ones (forced here through the open phases' `pop`): end_phase then appended it to the
    list the finish had just dropped, and the phase was lost."""
    req = tt.request(model="m")
    finisher = threading.Thread(target=req.finish)

    class FinishAfterPop(dict):  # type: ignore[type-arg]
        def pop(self, *args):  # type: ignore[no-untyped-def]
            value = super().pop(*args)
            finisher.start()  # the handler finishes now
            finisher.join(0.5)  # (where the two are serialized it waits for end_phase)
            return value

    req._open = FinishAfterPop()
    req.start_phase("prefill")
    req.end_phase("prefill")
    finisher.join(10)
    assert req.finished
    memory_sdk.tracing.force_flush()
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    prefill = _phases(memory_sdk, span).get(sc.PHASES["prefill"], [])
    assert len(prefill) == 1


def test_phases_marked_as_the_request_finishes_stay_inside_it(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """finish() reads its end time first; a phase another thread ends (or starts) right
    after that reading must not end after the request, nor start after it ended."""
    req = tt.request(model="m")
    req.start_phase("prefill")
    end = time.monotonic_ns()  # the finish's own reading, then the engine thread's marks:
    time.sleep(0.002)
    req.end_phase("prefill")  # ends 2 ms after the request
    req.start_phase("decode")  # starts after the request ended
    req._finish_at(end, None)
    memory_sdk.tracing.force_flush()
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    phases = _phases(memory_sdk, span)
    (prefill,) = phases[sc.PHASES["prefill"]]
    assert prefill.end_time == span.end_time  # clamped to the request's end
    assert sc.PHASES["decode"] not in phases  # no phase of negative length
    for children in phases.values():
        for child in children:
            assert span.start_time <= child.start_time <= child.end_time <= span.end_time


def test_token_times_from_two_threads_are_in_order(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """Two threads recording one request's tokens read the clock and append in two steps,
    so their appends can land out of clock order; the offsets sent are in order."""
    req = tt.request(model="m")
    t = time.monotonic_ns()
    # thread A read t + 2 ms and appended first; thread B read t + 1 ms and appended after
    req._tokens.extend([t + 2_000_000, t + 1_000_000, t + 3_000_000])
    req.finish()
    memory_sdk.tracing.force_flush()
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    offsets = sc.unpack_list(span.attributes[sc.TOKEN_OFFSETS_US])
    assert offsets == sorted(offsets) and len(offsets) == 3


def test_a_finisher_pass_takes_what_waits_when_it_starts(memory_sdk, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Requests keep finishing while the finisher builds: a pass that ran "until the queue
    is empty" never ended under a steady load, and force_flush() / shutdown() waited on it."""
    finisher = _request.RequestFinisher(interval_s=60)
    monkeypatch.setattr(_request, "finisher", finisher)
    for _ in range(20):
        tt.request(model="m").finish()
    real_complete = _request.RequestTrace._complete
    made = {"n": 0}

    def complete_while_load_goes_on(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        real_complete(self, *args, **kwargs)
        if made["n"] < 500:  # the load, bounded so that the old pass ends too
            made["n"] += 1
            tt.request(model="m").finish()

    monkeypatch.setattr(_request.RequestTrace, "_complete", complete_while_load_goes_on)
    assert finisher.flush(final=False) == 20
    assert len(finisher._items) == 20  # the ones that finished meanwhile: the next pass's
    made["n"] = 500  # the load stops; nothing is left for a later test's exporter
    assert finisher.flush() == 20


def test_a_step_flush_takes_what_waits_when_it_starts(memory_sdk, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    recorder = _steps.StepRecorder()
    monkeypatch.setattr(_steps, "recorder", recorder)
    made = {"n": 0}

    class LoadedStep(_steps.EngineStep):
        __slots__ = ()

        def record(self):  # type: ignore[no-untyped-def]
            if made["n"] < 500:  # a step recorded while the flusher reads this one
                made["n"] += 1
                with LoadedStep(decode=["r"]):
                    pass
            return super().record()

    for _ in range(10):
        with LoadedStep(decode=["r"]):
            pass
    assert recorder.flush(final=False) == 10
    assert len(recorder._items) == 10
    made["n"] = 500  # the load stops; nothing is left for a later test's exporter
    assert recorder.flush() == 10
