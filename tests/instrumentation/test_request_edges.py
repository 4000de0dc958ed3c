"""A request's edges: int ids (0 included), phases marked by another thread while it
finishes, and log lines that must not quote what the host handed over."""

from __future__ import annotations

import logging
import sys
import threading
from types import FrameType
from typing import Any

import pytest

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _safety
from tokentrace.instrumentation import semconv as sc
from tokentrace.instrumentation._request import RequestTrace

PROMPT = "Summarize my medical record: patient John Doe, HIV positive"


@pytest.fixture
def caplog(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> pytest.LogCaptureFixture:
    """`caplog`, with the SDK's log-once memory fresh: an earlier test may have logged a site."""
    monkeypatch.setattr(_safety, "_seen", set())
    caplog.set_level(logging.WARNING)
    return caplog


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tokentrace"]


# ---------------------------------------------------------------- request ids


def test_request_id_zero_is_an_id(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """A scheduler's first int id is 0: its request and its engine steps must match."""
    for rid in (0, 1):
        with tt.request(request_id=rid) as req:  # type: ignore[arg-type]
            with tt.engine_step(decode=[rid]):
                req.token()
        assert req.request_id == str(rid)
    spans = memory_sdk.spans()
    requests = [s.attributes[sc.REQUEST_ID] for s in spans if s.name == sc.SPAN_REQUEST]
    (steps,) = [s for s in spans if s.name == sc.SPAN_ENGINE_STEPS]
    assert requests == ["0", "1"]
    assert steps.attributes[sc.STEP_REQUEST_IDS] == sc.pack_list(["0", "1"])


def test_no_request_id_gets_a_generated_one(memory_sdk, caplog) -> None:  # type: ignore[no-untyped-def]
    class NoText:
        def __str__(self) -> str:
            raise RuntimeError("no")

    ids = [tt.request(request_id=rid).request_id for rid in (None, "", NoText())]  # type: ignore[arg-type]
    assert all(rid.startswith("req-") for rid in ids) and len(set(ids)) == 3
    assert any("the id has no text (NoText" in m for m in _warnings(caplog))


# ---------------------------------------------------------------- phases racing the finish


def test_phases_marked_by_another_thread_during_finish_are_not_lost(memory_sdk, caplog) -> None:  # type: ignore[no-untyped-def]
    """A scheduler thread opens phases while the request's own thread finishes it.

    The interleaving is made exact: a trace function runs the scheduler's
    `start_phase` at every line `finish()` executes (a thread switch can come at
    any of them), on the request as it is then and on the phase dict the
    scheduler read before (a thread preempted between reading and writing it).
    """
    req = tt.request(request_id="raced")
    for k in range(30):
        req.start_phase(f"p{k}")
    held = req._open  # what the scheduler thread read before the finish
    late = iter(range(10_000))

    def scheduler_marks(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            n = next(late)
            held[f"s{n}"] = 0
            req.start_phase(f"t{n}")
        return scheduler_marks

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return scheduler_marks if frame.f_code is RequestTrace.finish.__code__ else None

    sys.settrace(tracer)
    try:
        req.finish()
    finally:
        sys.settrace(None)
    spans = memory_sdk.spans()
    (span,) = [s for s in spans if s.name == sc.SPAN_REQUEST]
    phases = {s.name for s in spans if s.parent and s.parent.span_id == span.context.span_id}
    assert {f"tokentrace.p{k}" for k in range(30)} <= phases  # none of its own phases lost
    assert not [m for m in _warnings(caplog) if "request finish" in m]


@pytest.mark.slow
def test_phases_marked_by_a_scheduler_thread_while_requests_finish(memory_sdk, caplog) -> None:  # type: ignore[no-untyped-def]
    """The same with real threads switching as often as Python allows (a smoke test)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for i in range(200):
            req = tt.request(request_id=f"r{i}")
            for k in range(30):
                req.start_phase(f"p{k}")
            go = threading.Event()

            def scheduler(req: tt.RequestTrace = req, go: threading.Event = go) -> None:
                go.wait()
                for k in range(30):
                    req.start_phase(f"s{k}")

            thread = threading.Thread(target=scheduler)
            thread.start()
            go.set()
            req.finish()
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    spans = memory_sdk.spans()
    requests = {s.context.span_id for s in spans if s.name == sc.SPAN_REQUEST}
    own = [s for s in spans if s.parent and s.parent.span_id in requests and ".p" in s.name]
    assert len(requests) == 200 and len(own) == 200 * 30
    assert not [m for m in _warnings(caplog) if "request finish" in m]


# ---------------------------------------------------------------- what the log may say


def test_misused_values_are_logged_by_type_not_by_content(memory_sdk, caplog) -> None:  # type: ignore[no-untyped-def]
    """`record_content` is off: a prompt handed where a count goes must not reach the log."""
    with tt.request() as req:
        req.set_tokens(prompt=PROMPT)  # type: ignore[arg-type]  # the text, not its length
        req.token(PROMPT)  # type: ignore[arg-type]
        tt.TokenBatch([PROMPT])  # type: ignore[list-item]
    memory_sdk.spans()
    logged = _warnings(caplog)
    assert any(
        f"{sc.PROMPT_TOKENS} is not a number (str of length {len(PROMPT)}" in m for m in logged
    )
    assert any(f"count is not a number (str of length {len(PROMPT)}" in m for m in logged)
    assert any(f"not str of length {len(PROMPT)}" in m for m in logged)
    assert not [m for m in logged if "John Doe" in m]
