"""What the tail-sampling decider hands over after the DuckDB writer thread has stopped
is lost (nothing will write it until a restart): the loss is logged once for the
episode, with what the first lost round held, counted (`PipelineStats.*_lost`), and its
total logged at shutdown.  A round that waits for room in a full queue when the thread
stops gives up too, rather than waiting forever (and the shutdown flush behind it)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from otlp_traces import request_trace

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.collector.writer import WriteBatch, Writer

LOST = "decided data is lost while the DuckDB writer thread is stopped"
TOTAL = "decided after the DuckDB writer thread stopped and never written"


class _ThreadKilled(BaseException):
    """What no `except Exception` catches: stands for whatever might still end the thread."""


def _kill(writer: Writer, gate: threading.Event | None = None) -> None:
    """Makes the writer thread end at its next write (once `gate` is set, if given)."""

    def killed(items: list[WriteBatch]) -> None:
        if gate is not None:
            gate.wait(10)
        raise _ThreadKilled("the writer thread ends")

    writer._write_items = killed  # type: ignore[method-assign]


def _wait_dead(writer: Writer) -> None:
    deadline = time.monotonic() + 10
    while writer._thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not writer._thread.is_alive()


def _one_request() -> WriteBatch:
    return WriteBatch(requests=summarize_trace(request_trace()).requests)


def _messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_rounds_decided_after_the_writer_stopped_are_logged_once_counted_and_totalled(
    make_rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tokentrace.collector")
    rig = make_rig()  # grace 1 s, on the fake clock
    p = rig.pipeline
    for _ in range(2):
        assert p.offer(request_trace()) is None
    rig.clock.advance(0.5)
    for _ in range(3):
        assert p.offer(request_trace()) is None
    _kill(rig.writer)
    assert rig.writer.submit(_one_request())
    _wait_dead(rig.writer)

    rig.clock.advance(0.6)  # the first two traces are due
    assert p.decide_ready() == 2
    lost = _messages(caplog, LOST)
    assert len(lost) == 1, lost
    assert "2 traces of this decision round (2 rows: 2 request summaries" in lost[0]
    assert "writer thread stopped" in lost[0]  # the reason, as /readyz gives it

    for _ in range(3):  # later rounds: counted, not logged again
        rig.clock.advance(0.6)
        p.decide_ready()
    assert len(_messages(caplog, LOST)) == 1
    assert p.buffered_traces == 0
    assert (p.stats.batches_lost, p.stats.traces_lost, p.stats.rows_lost) == (2, 5, 5)

    p.close()  # the episode's total at shutdown
    total = _messages(caplog, TOTAL)
    assert total == [
        "tokentrace: 5 traces (5 rows) were decided after the DuckDB writer thread "
        "stopped and never written (2 batches)"
    ]
    assert not _messages(caplog, "writer queue full")
    assert rig.writer.stopped


@pytest.mark.slow
def test_a_round_waiting_for_room_when_the_writer_stops_gives_up_and_says_so(
    make_rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tokentrace.collector")
    rig = make_rig(max_pending=1)
    writer, p = rig.writer, rig.pipeline
    assert p.offer(request_trace()) is None
    gate = threading.Event()
    _kill(writer, gate)
    assert writer.submit(_one_request())  # taken by the thread, which then waits on `gate`
    deadline = time.monotonic() + 10
    while writer._queue.qsize() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.submit(_one_request())  # the queue is full now
    assert not writer.submit(_one_request())

    rig.clock.advance(2)
    decider = threading.Thread(target=p.decide_ready, daemon=True)
    decider.start()
    time.sleep(0.3)
    assert decider.is_alive()  # waiting for room: backpressure
    gate.set()  # the writer thread ends with the queue full: no room will ever come
    decider.join(10)
    assert not decider.is_alive(), "the decision round waits forever on a stopped writer"
    assert p.stats.traces_lost == 1
    assert len(_messages(caplog, LOST)) == 1
