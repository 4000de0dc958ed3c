"""A process forked while another thread holds one of the SDK's locks: the child still runs.

A forked child has only the forking thread; a lock another thread held at the
fork stays held there for ever.  Each SDK lock is made again in the child.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import pytest

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _cold_start, _forward, _pending_span, _request, _safety

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)"),
    # Python 3.12+ warns when a process with threads forks: that is the case tested
    pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning"),
]

#: a child not done by then is taken as hung (killed by SIGALRM); far beyond the 5 s its
#: force_flush(5_000) may take by itself, and a loaded machine's slow start of a fork child
CHILD_TIMEOUT_S = 60


def _run_in_child(body: Callable[[], None]) -> int:
    """Forks; the child runs `body` and exits 0 (1 if it raised); gives the raw wait status."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # (pytest-timeout's handler)
            signal.alarm(CHILD_TIMEOUT_S)  # a hung child is killed, not waited for
            body()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def _fork_while_held(lock: threading.Lock, body: Callable[[], None]) -> int:
    """Forks while another thread holds `lock`; gives the child's wait status."""
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            release.wait(30)

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    assert held.wait(30)
    try:
        pid_status = _run_in_child(body)
    finally:
        release.set()
        thread.join(5)
    return pid_status


def _request_with_late_attribute_and_error() -> None:
    with tt.request(model="child") as req:
        assert isinstance(req.span, _pending_span.PendingSpan)
        req.set_attribute("k", 1)
        req.record_error(ValueError("in the child"))
    tt.get_tracing().force_flush(5_000)


def _request_phase_and_finish() -> None:
    req = tt.request(model="c")
    req.start_phase("prefill")
    req.end_phase("prefill")
    req.finish()


_LOCKS: dict[str, tuple[Callable[[], threading.Lock], Callable[[], None]]] = {
    # which lock (read when the test runs), and what in the child takes it
    "pending span ops": (lambda: _pending_span._ops_lock, _request_with_late_attribute_and_error),
    "request attributes": (lambda: _request._lazy_lock, lambda: tt.request(model="c").span),
    "request phases": (lambda: _request._phase_lock, _request_phase_and_finish),
    "log once": (lambda: _safety._seen_lock, lambda: _safety.log_once("fork test: a new site")),
    "forward timer": (lambda: _forward.timer._resolve_lock, lambda: _forward.timer.poll()),
    "cold start": (lambda: _cold_start.tracker._lock, lambda: _cold_start.tracker.reset()),
    "request finisher": (lambda: _request.finisher._flush_lock, lambda: _request.finisher.flush()),
}


@pytest.mark.parametrize("which", sorted(_LOCKS))
def test_a_child_forked_while_a_lock_is_held_runs(memory_sdk, which) -> None:  # type: ignore[no-untyped-def]
    lock_of, body = _LOCKS[which]
    status = _fork_while_held(lock_of(), body)
    assert not os.WIFSIGNALED(status), f"the child hung on the {which} lock"
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_cold_start_lock_is_new_in_a_child_with_the_hosts_provider() -> None:
    # with the host's own provider the child keeps its configuration (nothing
    # remakes the cold-start tracker for it): its lock is still made again
    from opentelemetry.sdk.trace import TracerProvider

    tt.configure(tracer_provider=TracerProvider())
    try:

        def body() -> None:
            with tt.request(model="child"):
                pass
            _cold_start.tracker.reset()

        status = _fork_while_held(_cold_start.tracker._lock, body)
    finally:
        tt.shutdown()
        _cold_start.tracker.reset()
    assert not os.WIFSIGNALED(status), "the child hung on the cold start lock"
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_forward_timer_starts_afresh_in_a_child() -> None:
    def body() -> None:
        timer = _forward.timer
        assert timer._thread is None and not timer._inflight and not timer._free

    _forward.timer._start()  # the parent's worker thread, not the child's
    assert os.waitstatus_to_exitcode(_run_in_child(body)) == 0


@pytest.mark.slow
def test_children_forked_while_a_thread_serves_requests_finish(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    stop = threading.Event()

    def serve() -> None:  # a server thread: late attributes and errors take the SDK's locks
        while not stop.is_set():
            with tt.request(model="m") as req:
                req.set_attribute("k", 1)
                req.token()
                req.record_error(ValueError("x"))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        time.sleep(0.1)
        statuses = [_run_in_child(_request_with_late_attribute_and_error) for _ in range(20)]
    finally:
        stop.set()
        thread.join(5)
    hung = sum(os.WIFSIGNALED(s) for s in statuses)
    assert hung == 0, f"{hung} of {len(statuses)} children hung"
    assert all(os.waitstatus_to_exitcode(s) == 0 for s in statuses)


def test_a_child_forked_while_the_gpu_ring_is_locked_builds_its_spans(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    # the request span's GPU summary reads the sampler's ring under its lock: the
    # child has no sampler (its threads and NVML handle are the parent's)
    from test_gpu_sampler import FakeNvml

    from tokentrace.instrumentation import _gpu

    sampler = tt.start_gpu_sampler(interval_s=0.01, backend=FakeNvml(), export=False)
    try:

        def body() -> None:
            assert _gpu._active is None
            _request_with_late_attribute_and_error()

        status = _fork_while_held(sampler._ring_lock, body)
    finally:
        sampler.stop()
    assert not os.WIFSIGNALED(status), "the child hung on the GPU ring lock"
    assert os.waitstatus_to_exitcode(status) == 0
