"""Tail sampling through the real pipeline and writer on a real DuckDB file, fake clock."""

from __future__ import annotations

from otlp_traces import new_id, request_trace

from tokentrace.collector import sampling as sp
from tokentrace.collector.refusals import REFUSED_BUFFER_FULL, REFUSED_WRITER_BEHIND
from tokentrace.collector.sampling import P99Tracker, Sampler, SloLimits, parse_rules
from tokentrace.instrumentation import semconv as sc
from tokentrace.store import reasons


def test_sampled_out_traces_still_have_summary_rows(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(Sampler(baseline=0.0, p99=P99Tracker(warmup=0)))
    traces = [request_trace() for _ in range(20)]
    for spans in traces:
        assert rig.pipeline.add(spans)
    rig.clock.advance(1.5)
    assert rig.pipeline.decide_ready() == 20
    rows = rig.rows("SELECT kept, sample_reason, count(*) FROM requests GROUP BY ALL")
    assert rows == [(False, reasons.REASON_DROPPED, 20)]
    assert rig.rows("SELECT count(*) FROM spans") == [(0,)]
    assert rig.rows("SELECT count(*) FROM itl_hist") == [(20,)]


def test_error_and_slo_traces_are_kept_whole(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(Sampler(baseline=0.0, slo=SloLimits(ttft_ms=500), p99=P99Tracker(warmup=0)))
    err = request_trace(error=True)
    slow = request_trace(ttft_ms=900)
    fine = request_trace()
    for spans in (err, slow, fine):
        rig.pipeline.add(spans)
    rig.clock.advance(1.5)
    rig.pipeline.decide_ready()
    kept = dict(rig.rows("SELECT trace_id, reason FROM kept_traces"))
    assert kept == {err[0].trace_id: reasons.REASON_ERROR, slow[0].trace_id: reasons.REASON_SLO}
    counts = dict(rig.rows("SELECT trace_id, count(*) FROM spans GROUP BY 1"))
    assert counts == {err[0].trace_id: 6, slow[0].trace_id: 6}
    assert rig.rows("SELECT count(*) FROM requests") == [(3,)]


def test_p99_of_model_route_keeps_the_outlier(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(Sampler(baseline=0.0, p99=sp.P99Tracker(min_samples=50, refresh=8, warmup=0)))
    for i in range(200):
        rig.pipeline.add(request_trace(ttft_ms=40 + (i % 10)))
    # another route's fast requests must not be judged against this route
    rig.pipeline.add(request_trace(route="/other", ttft_ms=3000))
    rig.clock.advance(1.5)
    rig.pipeline.decide_ready()
    stall = request_trace(ttft_ms=45, itl_ms=5, tokens=10)
    # one long stall in the decode: the largest inter-token gap is the outlier
    attrs = stall[-1].attributes
    offsets = sc.unpack_list(attrs[sc.TOKEN_OFFSETS_US])
    attrs[sc.TOKEN_OFFSETS_US] = sc.pack_list(offsets[:6] + [t + 400_000 for t in offsets[6:]])
    slow_ttft = request_trace(ttft_ms=400)
    rig.pipeline.add(stall)
    rig.pipeline.add(slow_ttft)
    rig.clock.advance(1.5)
    rig.pipeline.decide_ready()
    kept = dict(rig.rows("SELECT trace_id, reason FROM kept_traces"))
    assert kept[slow_ttft[0].trace_id] == reasons.REASON_P99_TTFT
    assert kept[stall[0].trace_id] in (reasons.REASON_P99_E2E, reasons.REASON_P99_ITL, reasons.REASON_P99_DECODE)
    assert len(kept) == 2  # the first request of /other had no p99 yet (and no warm-up here)


def test_attribute_rules_keep_matching_traces(make_rig) -> None:  # type: ignore[no-untyped-def]
    rules = parse_rules("tenant.id=acme, gen_ai.request.model=big")
    rig = make_rig(Sampler(baseline=0.0, rules=rules, p99=P99Tracker(warmup=0)))
    acme = request_trace(attributes={"tenant.id": "acme"})
    big = request_trace(model="big")
    other = request_trace(attributes={"tenant.id": "zeta"})
    for spans in (acme, big, other):
        rig.pipeline.add(spans)
    rig.clock.advance(1.5)
    rig.pipeline.decide_ready()
    kept = dict(rig.rows("SELECT trace_id, reason FROM kept_traces"))
    assert kept == {acme[0].trace_id: reasons.REASON_RULE, big[0].trace_id: reasons.REASON_RULE}


def test_baseline_is_decided_from_the_trace_id_with_its_weight(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(Sampler(baseline=0.25, p99=P99Tracker(warmup=0)))
    lucky = "0" * 18 + "f" * 14  # randomness at the top: kept by any baseline > 0
    unlucky = "f" * 18 + "0" * 14  # randomness 0: never kept below 100 %
    rig.pipeline.add(request_trace(lucky))
    rig.pipeline.add(request_trace(unlucky))
    rig.clock.advance(1.5)
    rig.pipeline.decide_ready()
    assert rig.rows("SELECT trace_id, reason, weight FROM kept_traces") == [
        (lucky, reasons.REASON_BASELINE, 4.0)
    ]
    assert rig.rows("SELECT sample_weight FROM requests WHERE trace_id = ?", [lucky]) == [(4.0,)]


def test_late_spans_follow_the_first_decision(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(Sampler(baseline=0.0, p99=P99Tracker(warmup=0)))
    kept = request_trace(error=True)
    dropped = request_trace()
    rig.pipeline.add(kept[:-1] + kept[-1:])
    rig.pipeline.add(dropped)
    rig.clock.advance(1.5)
    rig.pipeline.decide_ready()
    late_k = request_trace(kept[0].trace_id)[0]
    late_d = request_trace(dropped[0].trace_id)[0]
    assert rig.pipeline.add([late_k, late_d])
    assert rig.pipeline.buffered_spans == 0  # they did not open new traces
    rig.pipeline.decide_ready()
    counts = dict(rig.rows("SELECT trace_id, count(*) FROM spans GROUP BY 1"))
    assert counts == {kept[0].trace_id: 7}
    assert rig.pipeline.stats.late_spans_dropped == 1
    assert rig.rows("SELECT count(*) FROM requests") == [(2,)]


def test_server_root_under_an_absent_parent_is_decided_after_grace(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(grace_s=1.0, decision_wait_s=30.0)
    # traceparent from an uninstrumented client: the SERVER span's parent never arrives
    orphan = request_trace(parent_span_id=new_id(8))
    rig.pipeline.add(orphan)
    rig.clock.advance(0.5)
    assert rig.pipeline.decide_ready() == 0
    rig.clock.advance(0.6)
    assert rig.pipeline.decide_ready() == 1
    assert rig.rows("SELECT count(*) FROM requests") == [(1,)]


def test_nested_server_span_waits_for_the_real_root(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(grace_s=1.0, decision_wait_s=30.0)
    gateway = request_trace()
    gateway_root = gateway[-1]
    # the backend's SERVER span is a child of a span of the gateway we already hold
    backend = request_trace(gateway_root.trace_id, parent_span_id=gateway[0].span_id)
    rig.pipeline.add(gateway[:-1] + backend)
    rig.clock.advance(2)
    assert rig.pipeline.decide_ready() == 0  # no root yet: still waiting
    rig.pipeline.add([gateway_root])
    rig.clock.advance(1.1)
    assert rig.pipeline.decide_ready() == 1


def test_trace_without_root_is_decided_after_decision_wait(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(grace_s=1.0, decision_wait_s=5.0)
    rig.pipeline.add(request_trace()[:-1])  # children only
    rig.clock.advance(4.9)
    assert rig.pipeline.decide_ready() == 0
    rig.clock.advance(0.2)
    assert rig.pipeline.decide_ready() == 1


def test_buffer_bound_holds_under_a_flood(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(max_buffered_spans=60, grace_s=100, decision_wait_s=1000)
    accepted = refused = 0
    for _ in range(40):
        why = rig.pipeline.offer(request_trace())
        if why is None:
            accepted += 1
        else:
            assert why == REFUSED_BUFFER_FULL
            refused += 1
        assert rig.pipeline.buffered_spans <= 60
    assert accepted == 10 and refused == 30
    # past the high-water mark the oldest traces are decided early, and counted
    rig.pipeline.decide_ready()
    assert rig.pipeline.buffered_spans <= 60 * 0.75
    assert rig.pipeline.stats.traces_evicted_early == 3
    assert rig.rows("SELECT count(*) FROM requests") == [(3,)]
    rig.pipeline.close()
    assert rig.rows("SELECT count(*) FROM requests") == [(accepted,)]


def test_writer_behind_refuses_before_accepting(make_rig) -> None:  # type: ignore[no-untyped-def]
    from tokentrace.analyzer.attribution import summarize_trace
    from tokentrace.collector.writer import WriteBatch

    rig = make_rig(max_pending=2)
    rig.writer.close()  # a writer that takes nothing more off its queue: it has fallen behind
    summary = summarize_trace(request_trace()).requests
    while rig.writer.submit(WriteBatch(requests=summary)):
        pass
    assert rig.pipeline.offer(request_trace()) == REFUSED_WRITER_BEHIND
    assert rig.pipeline.buffered_spans == 0
    assert rig.pipeline.stats.spans_rejected == 6


def test_close_decides_and_flushes_everything(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(grace_s=100)
    for _ in range(7):
        rig.pipeline.add(request_trace())
    rig.pipeline.close()
    assert rig.rows("SELECT count(*) FROM requests") == [(7,)]


def test_malformed_rule_is_a_clear_error() -> None:
    import pytest

    with pytest.raises(ValueError, match="key=value"):
        parse_rules("tenant")
