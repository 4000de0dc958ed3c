"""The decision cache (`collector/decision_cache.py`): late spans follow a cached
decision, a kept trace's span ids catch a retried export, and what the cache forgot
moves the recheck horizon."""

from __future__ import annotations

from otlp_traces import T0, request_trace

from tokentrace.collector.decision_cache import DecisionCache, span_ids
from tokentrace.collector.pipeline_stats import PipelineStats
from tokentrace.collector.stored import RESEND_MARGIN_NS

S = 1_000_000_000


def _cache(size: int = 10) -> tuple[DecisionCache, PipelineStats]:
    stats = PipelineStats()
    return DecisionCache(size, stats), stats


def test_late_spans_of_a_kept_trace_are_queued_once_each() -> None:
    cache, stats = _cache()
    spans = request_trace()
    trace_id = spans[0].trace_id
    cache.record([(trace_id, True)], [(trace_id, span_ids(spans[:4]))], T0, set())
    assert cache.get(trace_id) is True
    cache.keep_late(trace_id, spans)  # a retry of the whole export: 2 spans are new
    cache.keep_late(trace_id, spans[4:])  # ... and sent again
    assert cache.take_late() == spans[4:]
    assert cache.take_late() == []
    assert (stats.late_spans_kept, stats.late_duplicates_dropped) == (2, 6)


def test_late_spans_of_a_dropped_trace_are_counted_dropped() -> None:
    cache, stats = _cache()
    cache.record([("t1", False)], [], T0, set())
    assert cache.get("t1") is False and cache.get("t2") is None
    cache.drop_late(3)
    assert stats.late_spans_dropped == 3 and cache.take_late() == []


def test_the_oldest_decisions_are_forgotten_with_their_span_ids() -> None:
    cache, _ = _cache(size=3)
    for i in range(5):
        spans = request_trace()
        cache.record([(f"t{i}", True)], [(f"t{i}", span_ids(spans))], T0 + i * S, set())
    assert list(cache.decided) == ["t2", "t3", "t4"]
    assert sorted(cache.kept_span_ids) == ["t2", "t3", "t4"]


def test_the_recheck_horizon_is_the_latest_start_the_cache_forgot() -> None:
    cache, _ = _cache(size=2)
    assert cache.recheck_horizon(0) == -1  # nothing stored before, nothing forgotten
    assert cache.recheck_horizon(T0) == T0 + RESEND_MARGIN_NS  # stored before this process
    cache.record([("a", False), ("b", False)], [], T0 + 5 * S, set())
    cache.record([("c", False)], [], T0 + 9 * S, set())
    # "a" is forgotten: its round's latest start, not the newer round's
    assert cache.recheck_horizon(0) == T0 + 5 * S + RESEND_MARGIN_NS
    cache.record([("d", False), ("e", False)], [], T0 + 12 * S, set())
    assert list(cache.decided) == ["d", "e"]
    assert cache.recheck_horizon(0) == T0 + 9 * S + RESEND_MARGIN_NS
    assert cache.recheck_horizon(T0 + 20 * S) == T0 + 20 * S + RESEND_MARGIN_NS


def test_late_spans_of_a_rechecked_trace_are_rechecked_until_it_is_forgotten() -> None:
    cache, _ = _cache(size=1)
    old, new = request_trace(), request_trace()
    cache.record([(old[0].trace_id, True)], [], T0, {old[0].trace_id})
    assert cache.rechecked_among(old[:2] + new[:1]) == {old[0].trace_id}
    cache.record([(new[0].trace_id, True)], [], T0, set())
    assert cache.rechecked_among(old) == set()
