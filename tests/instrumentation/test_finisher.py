"""Finishing a request off the host's thread: exact times, nothing lost, nothing left at exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _request
from tokentrace.instrumentation import semconv as sc


def _one_request(tokens: int = 3) -> tuple[tt.RequestTrace, int, int]:
    """Runs one request with a prefill and `tokens` tokens; gives it and the wall times just
    before and just after its finish()."""
    req = tt.request(model="m")
    with req.phase("prefill"):
        time.sleep(0.002)
    for _ in range(tokens):
        req.token()
    before = time.time_ns()
    req.finish()
    return req, before, time.time_ns()


def test_span_is_built_by_the_daemon_thread_with_the_finish_time(memory_sdk, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    finisher = _request.RequestFinisher(interval_s=0.05)
    monkeypatch.setattr(_request, "finisher", finisher)
    req, finishing, finished = _one_request()
    assert req.span.is_recording()  # finish() only queued it: the host did not build spans
    time.sleep(0.3)  # built later: the end time must still be the finish time
    deadline = time.monotonic() + 10
    while req.span.is_recording() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not req.span.is_recording()
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    # within the finish() call (not "within 100 ms of it": a loaded machine's pause, a
    # garbage collection, can fall inside the call), and 0.3 s before the span was built
    assert finishing <= span.end_time <= finished
    assert len(sc.unpack_list(span.attributes[sc.TOKEN_OFFSETS_US])) == 3
    (prefill,) = memory_sdk.spans(sc.PHASES["prefill"])
    assert prefill.parent.span_id == span.context.span_id
    assert prefill.end_time - prefill.start_time >= 2_000_000


def test_a_full_queue_finishes_on_the_callers_thread(memory_sdk, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    finisher = _request.RequestFinisher(interval_s=60, max_pending=1)
    monkeypatch.setattr(_request, "finisher", finisher)
    reqs = [_one_request()[0] for _ in range(3)]
    assert [r.span.is_recording() for r in reqs] == [True, False, False]
    assert len(memory_sdk.spans(sc.SPAN_REQUEST)) == 3  # the flush builds the queued one
    assert len(memory_sdk.spans(sc.PHASES["prefill"])) == 3


def test_phases_marked_after_finish_are_not_emitted(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    req = tt.request()
    req.start_phase("queue")
    req.finish()  # the open queue phase closes at the finish
    req.start_phase("decode")
    req.end_phase("decode")
    names = [s.name for s in memory_sdk.spans()]
    assert sorted(names) == sorted([sc.SPAN_REQUEST, sc.PHASES["queue"]])


def test_finishing_from_many_threads_loses_nothing(memory_sdk, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    finisher = _request.RequestFinisher(interval_s=0.001, max_pending=8)
    monkeypatch.setattr(_request, "finisher", finisher)

    def worker() -> None:
        for _ in range(50):
            _one_request(tokens=1)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(memory_sdk.spans(sc.SPAN_REQUEST)) == 200
    assert len(memory_sdk.spans(sc.PHASES["prefill"])) == 200


def test_what_waits_at_exit_is_exported(tmp_path) -> None:
    """A program that never calls shutdown() still exports its last requests and steps."""
    out = tmp_path / "spans.txt"
    script = textwrap.dedent(
        f"""
        from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
        from tokentrace import instrumentation as tt

        class FileExporter(SpanExporter):
            def export(self, spans):
                with open({str(out)!r}, "a") as f:
                    for s in spans:
                        f.write(s.name + "\\n")
                return SpanExportResult.SUCCESS

        tt.configure(service_name="exit", exporter=FileExporter())
        with tt.request() as req:
            with tt.engine_step() as step:
                step.decode(req.request_id)
            req.token()
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    names = out.read_text().split()
    assert sorted(names) == sorted([sc.SPAN_REQUEST, sc.SPAN_ENGINE_STEPS])
