"""How often the SDK's flushers hand the GIL to the host: by time, not per item, and
not at all while they are behind (a host busy in Python keeps a GIL it is handed for a
switch interval, so a yield per item starved a flusher of small requests)."""

from __future__ import annotations

import threading
import time

import pytest

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _background, _request


class _Clock:
    """A perf_counter_ns that moves `step_ns` at every reading."""

    def __init__(self, step_ns: int) -> None:
        self.now = 10**12
        self.step = step_ns

    def __call__(self) -> int:
        self.now += self.step
        return self.now


@pytest.fixture
def yields(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts `time.sleep(0)` calls made on this thread (the flushes here run on it)."""
    calls: list[int] = []
    me = threading.get_ident()
    real_sleep = time.sleep

    def sleep(s: float) -> None:
        if s == 0 and threading.get_ident() == me:
            calls.append(1)
        real_sleep(s)

    monkeypatch.setattr(time, "sleep", sleep)
    return calls


def _queue_requests(finisher: _request.RequestFinisher, n: int) -> None:
    for _ in range(n):
        req = tt.request(model="m")
        req.token()
        req.finish()
    assert len(finisher._items) == n


def test_finisher_yields_by_time_not_per_request(memory_sdk, monkeypatch, yields) -> None:  # type: ignore[no-untyped-def]
    finisher = _request.RequestFinisher(interval_s=60)
    monkeypatch.setattr(_request, "finisher", finisher)
    # every clock reading is 0.1 ms later: a yield every 0.5 ms is one per ~5 requests
    monkeypatch.setattr(_background, "_perf_ns", _Clock(100_000), raising=False)
    _queue_requests(finisher, 60)
    assert finisher.flush(final=False) == 60
    assert 5 <= len(yields) <= 20  # was 60: one per request
    assert len(memory_sdk.spans("tokentrace.request")) == 60


def test_finisher_behind_keeps_the_gil_until_caught_up(memory_sdk, monkeypatch, yields) -> None:  # type: ignore[no-untyped-def]
    finisher = _request.RequestFinisher(interval_s=60)
    finisher._catch_up_at = 40
    monkeypatch.setattr(_request, "finisher", finisher)
    # a reading is 1 ms later: by time, every request would yield
    monkeypatch.setattr(_background, "_perf_ns", _Clock(1_000_000), raising=False)
    _queue_requests(finisher, 100)
    assert finisher.flush(final=False) == 100
    # no yield while 40 or more wait: only for the last 40 requests
    assert len(yields) == 40
    assert len(memory_sdk.spans("tokentrace.request")) == 100


def test_a_final_flush_never_yields(memory_sdk, monkeypatch, yields) -> None:  # type: ignore[no-untyped-def]
    finisher = _request.RequestFinisher(interval_s=60)
    monkeypatch.setattr(_request, "finisher", finisher)
    monkeypatch.setattr(_background, "_perf_ns", _Clock(1_000_000), raising=False)
    _queue_requests(finisher, 10)
    assert finisher.flush(final=True) == 10
    assert yields == []
