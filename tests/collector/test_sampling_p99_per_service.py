"""The running p99 is kept per (service.name, model, route), and its keys are bounded.

The demo's 9 services all serve the model `tiny-llm`: a scenario with very slow
requests set the p99 the next service's requests were judged by, and a finding
("big tenants slower", 40 requests) had no example trace kept.  Staging and
production, or two regions, serving one model name do the same: one's slow tail
hides the other's outliers, and a busy fast one's p99 makes every request of a
quiet slow one an outlier.  Service names are the sender's to choose, so the
keys stay capped.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest
from otlp_traces import request_trace

from tokentrace.analyzer.summary import RequestSummary
from tokentrace.collector import sampling as sp
from tokentrace.collector.sampling import P99Tracker, Sampler
from tokentrace.store import reasons

MODEL = "tiny-llm"


def _decide_round(rig: Any, traces: list[Any]) -> None:
    for spans in traces:
        assert rig.pipeline.add(spans)
    rig.clock.advance(1.5)  # past the rig's grace
    assert rig.pipeline.decide_ready() == len(traces)


def test_a_slow_service_does_not_hide_the_outliers_of_another_with_the_same_model(  # type: ignore[no-untyped-def]
    make_rig, clock
) -> None:
    """The demo: a scenario queued ~5 s, then a fast service of the same model whose
    few requests that queued 0.75 s (slow for it, fast for the first) are the finding."""
    tracker = P99Tracker(min_samples=50, clock=clock, warmup=0)
    rig = make_rig(Sampler(baseline=0.0, p99=tracker))
    rng = random.Random(5)
    queued = []
    for _ in range(100):
        q = rng.uniform(4000, 6000)
        queued.append(request_trace(service="svc-queued", model=MODEL, queue_ms=q, ttft_ms=q + 60))
    _decide_round(rig, queued)
    fast = []
    for _ in range(100):
        q = rng.uniform(2, 8)
        fast.append(request_trace(service="svc-fast", model=MODEL, queue_ms=q, ttft_ms=q + rng.uniform(40, 60)))
    _decide_round(rig, fast)
    # the other's tail is not the fast service's normal
    threshold = tracker.p99("svc-fast", MODEL, "/v1/chat", "ttft_ms")
    assert threshold is not None and threshold < 100
    outliers = [request_trace(service="svc-fast", model=MODEL, queue_ms=750, ttft_ms=800) for _ in range(3)]
    _decide_round(rig, outliers)
    ids = [spans[0].trace_id for spans in outliers]
    rows = rig.rows(
        "SELECT trace_id, service, kept, sample_reason, sample_weight FROM requests WHERE trace_id IN (?, ?, ?)", ids
    )
    assert sorted(rows) == sorted((t, "svc-fast", True, reasons.REASON_P99_TTFT, 1.0) for t in ids)
    kept = dict(rig.rows("SELECT trace_id, reason FROM kept_traces"))
    assert all(kept.get(t) == reasons.REASON_P99_TTFT for t in ids)


def _summary(service: str, ttft_ms: float, model: str = MODEL, route: str = "/v1/chat") -> RequestSummary:
    return RequestSummary(
        trace_id="0" * 32, request_id="r", start_ns=0, e2e_ms=ttft_ms + 400, queue_ms=0.0,
        prefill_ms=ttft_ms, decode_ms=400.0, ttft_ms=ttft_ms, itl_max_ms=20.0, model=model,
        route=route, service=service,
    )  # fmt: skip


def test_a_busy_fast_service_does_not_make_every_request_of_a_quiet_slow_one_an_outlier(clock) -> None:  # type: ignore[no-untyped-def]
    """Production (~50 ms, busy) and staging (~3 s, quiet) with the same model name."""
    sampler = Sampler(baseline=0.0, p99=P99Tracker(min_samples=20, clock=clock, warmup=0))
    rng = random.Random(7)

    def keep(service: str, ttft_ms: float) -> bool:
        clock.advance(0.01)
        return sampler.decide("0" * 32, (), [_summary(service, ttft_ms)], span_error=False).keep

    staging_kept = []
    for _ in range(80):
        for _ in range(150):
            keep("prod", rng.lognormvariate(3.9, 0.2))
        staging_kept.append(keep("staging", rng.lognormvariate(8.0, 0.2)))
    # staging's own p99 outliers only (one judged against prod's p99 kept all 80)
    assert sum(staging_kept) <= 6, sum(staging_kept)
    assert sampler.p99.p99("staging", MODEL, "/v1/chat", "ttft_ms") is not None


def test_the_warm_up_is_per_service(clock) -> None:  # type: ignore[no-untyped-def]
    tracker = P99Tracker(min_samples=10, clock=clock)
    observed = [tracker.observe(_summary("a", 50.0)) for _ in range(12)]
    assert observed == [reasons.REASON_P99_WARMUP] * 10 + [None] * 2
    # a second deployment of the same model/route warms up on its own
    assert tracker.observe(_summary("b", 50.0)) == reasons.REASON_P99_WARMUP


def test_p99_keys_are_capped_against_senders_that_make_up_service_names(  # type: ignore[no-untyped-def]
    clock, caplog
) -> None:
    tracker = P99Tracker(min_samples=3, clock=clock, max_keys=4)
    with caplog.at_level(logging.WARNING, logger="tokentrace.collector"):
        for i in range(1000):
            tracker.observe(_summary(f"made-up-{i}", 50.0))
    assert len(tracker._windows) == 4  # the first 4; the rest share the overflow's windows
    assert tracker._overflow is not None and tracker._overflow.count == 996
    assert tracker.shared_requests == 996  # what /metrics says: tokentrace_p99_shared_requests
    # the 996 warmed up once, together: a made-up name costs no more kept traces
    assert tracker.observe(_summary("made-up-1000", 50.0)) is None
    logged = [r.getMessage() for r in caplog.records if "keys within" in r.getMessage()]
    assert len(logged) == 1 and "more than 4 (service, model, route) keys" in logged[0]
    # a key silent for a whole window is forgotten, freeing its place
    clock.advance(sp.P99_WINDOW_S)
    assert tracker.observe(_summary("svc", 50.0)) == reasons.REASON_P99_WARMUP
    assert list(tracker._windows) == [("svc", MODEL, "/v1/chat")]


@pytest.mark.parametrize("part", ["service", "model", "route"])
def test_a_huge_name_is_not_held_whole_by_the_tracker(clock, part: str) -> None:  # type: ignore[no-untyped-def]
    tracker = P99Tracker(min_samples=3, clock=clock)
    huge = "x" * (4 << 20)
    names = {"service": "svc", "model": MODEL, "route": "/v1/chat", part: huge}
    tracker.observe(_summary(names["service"], 50.0, model=names["model"], route=names["route"]))
    (key,) = tracker._windows
    assert max(len(k) for k in key) == sp.MAX_P99_KEY_CHARS
    # names that differ only past the cut share a key
    names[part] = huge + "y"
    tracker.observe(_summary(names["service"], 50.0, model=names["model"], route=names["route"]))
    assert len(tracker._windows) == 1


def test_serve_exports_how_many_requests_shared_the_p99(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tokentrace.collector.collector import Collector
    from tokentrace.collector.settings import CollectorSettings

    collector = Collector(CollectorSettings(db=tmp_path / "m.duckdb", decode_processes=0))
    try:
        collector.sampler.p99.shared_requests = 7
        text = collector.metrics.render()[0].decode()
        assert "tokentrace_p99_shared_requests_total 7.0" in text
    finally:
        collector.close()
