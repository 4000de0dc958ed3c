"""The p99 rule follows the recent past, and a model/route's first requests are kept.

A newcomer's first run under load kept none of its slowest requests (the p99
rule waited for 100 requests), and after one bad early burst the running p99
never came down again (the sketches never forgot).  The p99 now comes from the
window being filled plus the one before (5 minutes each), and a model/route's
warm-up (its first `min_samples` requests) is kept whole with `p99_warmup`.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from ddsketch import DDSketch
from hypothesis import given, settings
from hypothesis import strategies as st
from otlp_traces import request_trace

from tokentrace.analyzer.summary import RequestSummary
from tokentrace.collector import sampling as sp
from tokentrace.collector.sampling import P99Tracker, Sampler, parse_rules
from tokentrace.collector.sketch import LatencySketch
from tokentrace.store import reasons

WINDOW_S = sp.P99_WINDOW_S


def _decide_round(rig: Any, traces: list[Any]) -> None:
    for spans in traces:
        assert rig.pipeline.add(spans)
    rig.clock.advance(1.5)  # past the rig's grace
    assert rig.pipeline.decide_ready() == len(traces)


def _kept(rig: Any) -> dict[str, tuple[str, float]]:
    return {t: (reason, weight) for t, reason, weight in rig.rows("SELECT trace_id, reason, weight FROM kept_traces")}


def test_the_slowest_requests_of_a_short_first_run_are_kept_whole(make_rig, clock) -> None:  # type: ignore[no-untyped-def]
    """The newcomer's run: a burst whose 12 slowest requests spent ~10 s queued."""
    rig = make_rig(Sampler(baseline=0.0, p99=P99Tracker(clock=clock)))  # default min_samples: 100
    rng = random.Random(3)
    slow = [request_trace(queue_ms=10_000 + 100 * i, ttft_ms=10_060 + 100 * i) for i in range(12)]
    fast = [request_trace(queue_ms=5, ttft_ms=40 + rng.randint(0, 30)) for _ in range(48)]
    burst = fast + slow
    rng.shuffle(burst)
    _decide_round(rig, burst)
    kept = _kept(rig)
    for spans in slow:
        assert kept.get(spans[0].trace_id) == (reasons.REASON_P99_WARMUP, 1.0)
    stored = dict(rig.rows("SELECT trace_id, count(*) FROM spans GROUP BY 1"))
    assert all(stored[spans[0].trace_id] == 6 for spans in slow)  # kept whole
    # every request has its summary, with the decision and a weight of 1
    assert rig.rows("SELECT count(*), count(*) FILTER (kept), sum(sample_weight) FROM requests") == [(60, 60, 60.0)]


def test_the_warm_up_keeps_at_most_min_samples_traces_of_a_model_route(make_rig, clock) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(Sampler(baseline=0.0, p99=P99Tracker(min_samples=100, clock=clock)))
    for _ in range(5):  # 250 unremarkable requests, decided 50 at a time
        _decide_round(rig, [request_trace() for _ in range(50)])
    _decide_round(rig, [request_trace(route="/v1/embed") for _ in range(30)])  # its own warm-up
    rows = rig.rows("SELECT route, sample_reason, count(*) FROM requests GROUP BY ALL ORDER BY ALL")
    assert rows == [
        ("/v1/chat", reasons.REASON_DROPPED, 150),
        ("/v1/chat", reasons.REASON_P99_WARMUP, 100),
        ("/v1/embed", reasons.REASON_P99_WARMUP, 30),
    ]


def test_a_slow_early_burst_stops_hiding_later_outliers_after_a_window(make_rig, clock) -> None:  # type: ignore[no-untyped-def]
    tracker = P99Tracker(min_samples=100, clock=clock)
    rig = make_rig(Sampler(baseline=0.0, p99=tracker))
    # the bad start: 150 requests queued ~10 s
    _decide_round(rig, [request_trace(queue_ms=9000 + i * 20, ttft_ms=9100 + i * 20) for i in range(150)])
    # then the service is fast: 20 requests every 30 s, for more than two windows
    elapsed = 0.0
    while elapsed < 2 * WINDOW_S + 60:
        _decide_round(rig, [request_trace(ttft_ms=40 + i) for i in range(20)])
        rig.clock.advance(30 - 1.5)
        elapsed += 30
    threshold = tracker.p99("svc", "m", "/v1/chat", "ttft_ms")
    assert threshold is not None and threshold < 100  # the burst no longer counts
    outlier = request_trace(ttft_ms=800)  # 15x the new normal, still 10x below the burst
    _decide_round(rig, [outlier])
    assert _kept(rig)[outlier[0].trace_id] == (reasons.REASON_P99_TTFT, 1.0)


def _summary(ttft_ms: float, model: str = "m", route: str = "/v1/chat") -> RequestSummary:
    return RequestSummary(
        trace_id="0" * 32, request_id="r", start_ns=0, e2e_ms=ttft_ms + 400, queue_ms=0.0,
        prefill_ms=ttft_ms, decode_ms=400.0, ttft_ms=ttft_ms, itl_max_ms=20.0, model=model, route=route,
    )  # fmt: skip


def _run(sampler: Sampler, clock: Any, ttfts: list[float], every_s: float) -> list[bool]:
    """Decides one request per `every_s` seconds; gives whether each was kept."""
    kept = []
    for ttft in ttfts:
        clock.advance(every_s)
        kept.append(sampler.decide("0" * 32, (), [_summary(ttft)], span_error=False).keep)
    return kept


def test_a_service_that_got_slower_sets_a_new_normal_within_two_windows(clock) -> None:  # type: ignore[no-untyped-def]
    sampler = Sampler(baseline=0.0, p99=P99Tracker(min_samples=100, clock=clock))
    rng = random.Random(11)
    # a day of fast requests (~50 ms), one every 2 s
    _run(sampler, clock, [rng.lognormvariate(3.9, 0.2) for _ in range(43_200)], every_s=2.0)
    # then every request is 10x slower, for three windows
    per_window = int(WINDOW_S / 2.0)
    kept = _run(sampler, clock, [rng.lognormvariate(6.2, 0.2) for _ in range(3 * per_window)], every_s=2.0)
    assert all(kept[:3])  # the change itself is caught
    third = kept[2 * per_window :]
    # by the third window the slow requests are the norm: ~1 % above their p99
    # (a sketch of the whole day kept every one of them: they were < 1 % of its values)
    assert sum(third) <= 0.05 * len(third), sum(third)


def test_a_whole_window_of_silence_starts_the_warm_up_over(clock) -> None:  # type: ignore[no-untyped-def]
    """The newcomer's later run, after the collector sat idle: kept whole again."""
    tracker = P99Tracker(min_samples=100, clock=clock)
    sampler = Sampler(baseline=0.0, p99=tracker)
    first = _run(sampler, clock, [12_000.0] * 150, every_s=0.1)
    assert sum(first) == 100
    clock.advance(WINDOW_S)
    later = _run(sampler, clock, [3000.0 + i for i in range(40)], every_s=0.1)
    assert all(later)  # judged against nothing from the first run
    # traffic that never pauses that long gets one warm-up only
    assert not any(_run(sampler, clock, [3000.0] * 200, every_s=WINDOW_S / 100)[60:])


def test_warm_up_traces_weigh_one_and_yield_to_rules(clock) -> None:  # type: ignore[no-untyped-def]
    lucky = "0" * 18 + "f" * 14  # kept by any baseline > 0, with weight 1/baseline
    sampler = Sampler(baseline=0.25, rules=parse_rules("tenant.id=acme"), p99=P99Tracker(clock=clock))
    decision = sampler.decide(lucky, (), [_summary(50.0)], span_error=False)
    # kept for sure, not by chance: a weight of 4 would count it four times
    assert (decision.keep, decision.reason, decision.weight) == (True, reasons.REASON_P99_WARMUP, 1.0)
    spans = request_trace(attributes={"tenant.id": "acme"})
    assert sampler.decide(spans[0].trace_id, spans, [_summary(50.0)]).reason == reasons.REASON_RULE
    assert reasons.REASON_P99_WARMUP in reasons.ALL_REASONS


def test_the_warm_up_keeps_only_its_first_p99_warmup_traces(clock) -> None:  # type: ignore[no-untyped-def]
    tracker = P99Tracker(min_samples=10, refresh=4, clock=clock, warmup=3)
    assert _run(Sampler(baseline=0.0, p99=tracker), clock, [50.0] * 12, every_s=1.0) == [True] * 3 + [False] * 9
    tracker = P99Tracker(min_samples=10, refresh=4, clock=clock, warmup=0)
    assert not any(_run(Sampler(baseline=0.0, p99=tracker), clock, [50.0] * 10, every_s=1.0))
    assert tracker.p99("", "m", "/v1/chat", "ttft_ms") is not None  # the requests fed the sketches


def test_p99_warmup_setting(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tokentrace.collector.settings import ENV, SettingError, resolve

    assert resolve().p99_warmup == 100 == resolve().p99_min_samples
    monkeypatch.setenv(ENV["p99_warmup"], "0")
    assert resolve().p99_warmup == 0
    monkeypatch.setenv(ENV["p99_warmup"], "-1")
    with pytest.raises(SettingError, match="p99_warmup must be >= 0"):
        resolve()


def test_model_routes_are_bounded_and_forgotten_after_a_silent_window(clock) -> None:  # type: ignore[no-untyped-def]
    tracker = P99Tracker(min_samples=3, clock=clock, max_keys=2)
    for model in ("a", "b", "c", "d"):
        tracker.observe(_summary(50.0, model=model))
    assert len(tracker._windows) == 2  # "c" and "d" share the overflow's windows
    assert tracker._overflow is not None and tracker._overflow.count == 2
    clock.advance(WINDOW_S)
    tracker.observe(_summary(50.0, model="e"))
    assert list(tracker._windows) == [("", "e", "/v1/chat")]  # the silent ones are forgotten


positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(positive, max_size=200), st.lists(positive, max_size=200), st.sampled_from([0.0, 0.5, 0.99, 1.0]))
def test_merged_quantile_answers_as_ddsketch_merge(a: list[float], b: list[float], q: float) -> None:
    mine, theirs = LatencySketch(0.01), LatencySketch(0.01)
    ref_a, ref_b = DDSketch(relative_accuracy=0.01), DDSketch(relative_accuracy=0.01)
    for v in a:
        mine.add(v)
        ref_a.add(v)
    for v in b:
        theirs.add(v)
        ref_b.add(v)
    ref_a.merge(ref_b)
    expected = ref_a.get_quantile_value(q) if a or b else None
    assert mine.merged_quantile(theirs, q) == expected
    assert theirs.merged_quantile(mine, q) == expected
    theirs.clear()
    assert theirs.count == 0 and theirs.merged_quantile(mine, q) == mine.quantile(q)
