"""`force_flush()` against a slow collector: one provider flush at a time, never a
thread a call.

OpenTelemetry's flush waits on its export lock whatever its timeout; each
`force_flush(200)` started its own `tokentrace-flush` thread, which stayed until the
collector answered: a worker flushing after each unit of work went from 14 to 147
threads in 30 s.  A real OTLP/HTTP receiver on 127.0.0.1 holds its answers here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from _gated_otlp import GatedTraceReceiver

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _export

CALLS = 25


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[GatedTraceReceiver]:
    # the held export must not time out while the test holds it (3 s by default)
    monkeypatch.setattr(_export, "EXPORT_TIMEOUT_S", 60.0)
    r = GatedTraceReceiver()
    yield r
    r.close()
    tt.shutdown()


def _flush_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tokentrace-flush"]


def _end_spans(tracing: tt.Tracing, count: int, prefix: str) -> None:
    for i in range(count):
        tracing.tracer.start_span(f"{prefix}{i}").end()


@pytest.mark.slow
def test_flushes_against_a_slow_collector_share_one_thread(receiver) -> None:  # type: ignore[no-untyped-def]
    tracing = tt.configure(endpoint=receiver.url, service_name="flush-threads")
    _end_spans(tracing, 3, "first")
    assert tracing.force_flush(50) is False  # its export is held: not finished
    assert receiver.wait_for_exports(1)
    for i in range(CALLS):  # a unit of work, then a short flush, as a batch worker does
        _end_spans(tracing, 2, f"unit{i}-")
        assert tracing.force_flush(20) is False
        assert len(_flush_threads()) <= 1
    assert len(_flush_threads()) == 1
    # the collector answers: one flush delivers what every call waited for
    receiver.gate.set()
    assert tracing.force_flush(30_000) is True
    assert receiver.spans == 3 + 2 * CALLS
    assert tracing.exporter is not None and tracing.exporter.dropped == 0
    # and the thread ends once nothing more is asked of it
    for thread in _flush_threads():
        thread.join(30)
    assert not _flush_threads()


@pytest.mark.slow
def test_a_call_made_while_a_flush_runs_gets_its_own_spans_flushed(receiver) -> None:  # type: ignore[no-untyped-def]
    """A call that joins a flush under way waits for the next round, which starts after
    the call: spans ended after the running round began still leave before it returns."""
    tracing = tt.configure(endpoint=receiver.url, service_name="flush-rounds")
    _end_spans(tracing, 2, "before")
    assert tracing.force_flush(20) is False
    assert receiver.wait_for_exports(1)
    _end_spans(tracing, 3, "during")  # queued while the first round's export is held
    results: list[bool] = []
    waiter = threading.Thread(target=lambda: results.append(tracing.force_flush(30_000)))
    waiter.start()
    receiver.gate.set()
    waiter.join(60)
    assert results == [True]
    assert sorted(receiver.span_names()) == sorted(
        [f"before{i}" for i in range(2)] + [f"during{i}" for i in range(3)]
    )


def test_single_flight_runs_one_call_at_a_time_and_serves_the_ones_that_wait() -> None:
    flight = _export.SingleFlight("test-flight")
    release, started = threading.Event(), threading.Semaphore(0)
    calls: list[int] = []

    def work(n: int) -> int:
        calls.append(n)
        started.release()
        release.wait(30)
        return n

    assert flight.run(lambda: work(1), 0.0) == (False, None)
    assert started.acquire(timeout=30)  # round 1 runs
    # calls while it runs: none starts a thread, and all of them ask for one next round
    assert [flight.run(lambda n=n: work(n), 0.01) for n in range(2, 10)] == [(False, None)] * 8
    (thread,) = [t for t in threading.enumerate() if t.name == "tokentrace-test-flight"]
    release.set()
    thread.join(30)
    assert not thread.is_alive()  # nothing more asked: it ends
    assert calls == [1, 9]  # round 1, then one round (the latest call's) for all that came
    assert flight.run(lambda: work(10), 30) == (True, 10)
