"""Shapes from real demo runs that a detector once got wrong, each kept as a scenario."""

from __future__ import annotations

import pytest

from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.report import build_report

from . import workloads


@pytest.mark.slow
def test_cpu_contention_is_not_stutter(write_workload) -> None:  # type: ignore[no-untyped-def]
    w = workloads.cpu_contention()
    stalled = sum(1 for s in w.requests if s.stall_count)
    # the shape is the one that fooled the detector: many streams with a gap > 4x their median
    assert stalled / len(w.requests) > 0.12
    findings = build_report(write_workload(w))["findings"]
    assert [f["complaint"] for f in findings] == []


def _complaints(conn, filters: Filters | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    return [f["complaint"] for f in build_report(conn, filters)["findings"]]


@pytest.mark.slow
def test_one_cold_request_on_one_instance_is_no_cold_start(write_workload) -> None:  # type: ignore[no-untyped-def]
    conn = write_workload(workloads.two_services())
    # the other service's pods must not count towards this service's instances
    assert "cold_start" not in _complaints(conn, Filters(service="solo"))
    fleet = build_report(conn, Filters(service="fleet"))["findings"]
    assert fleet and fleet[0]["complaint"] == "cold_start"
    assert fleet[0]["evidence"][0]["instances"] == 3
    assert "cold_start" in _complaints(conn)


@pytest.mark.slow
def test_batch_mode_evidence_leads_with_the_deciding_measure(write_workload) -> None:  # type: ignore[no-untyped-def]
    findings = build_report(write_workload(workloads.batch_slows_decode()))["findings"]
    assert findings and findings[0]["complaint"] == "batch_mode_breaks_live", findings
    first, *rest = findings[0]["evidence"]
    # TPOT decided it: it leads, and the TTFT comparison (better beside batch jobs) is not first
    assert first["text"].startswith("live requests while batch jobs run: TPOT"), first["text"]
    assert "TTFT" not in first["text"]
    assert first["tpot_p50_ms"] > 1.5 * first["baseline_tpot_p50_ms"]
    ttft = next(e for e in rest if "ttft_p50_ms" in e)
    assert ttft["ttft_p50_ms"] < ttft["baseline_ttft_p50_ms"]
    assert ttft["text"].index("TTFT") > ttft["text"].index("queue wait")


@pytest.mark.slow
def test_queue_for_every_prompt_size_is_not_tiny_prompts_slow(write_workload) -> None:  # type: ignore[no-untyped-def]
    w = workloads.steady_overload()
    tiny = sorted(w.requests, key=lambda s: s.prompt_tokens or 0)[: len(w.requests) // 4]
    # the shape that fooled the detector: queue is most of a tiny prompt's time
    assert sorted(s.queue_ms / s.e2e_ms for s in tiny)[len(tiny) // 2] > 0.5
    findings = build_report(write_workload(w))["findings"]
    assert "tiny_prompts_slow" not in [f["complaint"] for f in findings], findings


def test_slow_gateway_for_every_prompt_size_is_still_tiny_prompts_slow(write_workload) -> None:  # type: ignore[no-untyped-def]
    findings = build_report(write_workload(workloads.slow_gateway()))["findings"]
    assert findings and findings[0]["complaint"] == "tiny_prompts_slow", findings


def test_one_tenants_bursts_are_not_peak_hours(write_workload) -> None:  # type: ignore[no-untyped-def]
    found = _complaints(write_workload(workloads.tenant_bursts()))
    # the busiest slices are megacorp's bursts, not everyone's busy hour
    assert "peak_hours" not in found, found
    assert found and found[0] == "big_tenants_slower", found


@pytest.mark.slow
def test_stutter_beside_prefills_below_the_biggest(write_workload) -> None:  # type: ignore[no-untyped-def]
    w = workloads.stutter_few_giants()
    findings = build_report(write_workload(w))["findings"]
    assert findings and findings[0]["complaint"] == "stutter", findings
    linked = findings[0]["evidence"][1]
    # the 1,200-token prefills count as large: half the biggest, below the p90 (2,000)
    assert linked["large_prefill_tokens"] == 1000
    assert linked["stalled_with_large_prefill"] > linked["smooth_with_large_prefill"] + 0.15


@pytest.mark.slow
def test_another_replicas_prefills_explain_no_stalls(write_workload) -> None:  # type: ignore[no-untyped-def]
    # engine steps were joined to streams by time only: i1's prefills "explained" i0's
    # mild freezes, and the evidence said "in the same engine"
    findings = build_report(write_workload(workloads.prefills_on_another_replica()))["findings"]
    assert not any(f["complaint"] == "stutter" for f in findings), findings


@pytest.mark.slow
def test_kv_pressure_names_only_its_own_replicas_requests(write_workload) -> None:  # type: ignore[no-untyped-def]
    # requests were matched to the full KV cache by time only, whichever replica served them
    w = workloads.kv_cache_pressure(other_replica=True)
    findings = build_report(write_workload(w))["findings"]
    kv = next(f for f in findings if f["complaint"] == "kv_cache_pressure")
    instance = {r.trace_id: r.instance for r in w.requests}
    assert kv["affected_trace_ids"]
    assert {instance[t] for t in kv["affected_trace_ids"]} == {"i0"}


def _affected(conn) -> dict[str, tuple[list[str], int]]:  # type: ignore[no-untyped-def]
    return {
        f["complaint"]: (f["affected_trace_ids"], f["affected_count"])
        for f in build_report(conn)["findings"]
    }


@pytest.mark.slow
def test_affected_requests_are_the_same_for_the_same_data_whatever_the_order(write_workload) -> None:  # type: ignore[no-untyped-def]
    # A finding's affected requests (and the examples taken from them) are its worst first;
    # requests that tie on the measure came in whatever order the scan gave them, so a
    # static database showed other examples and another "all affected" list each refresh.
    w = workloads.stutter()
    for s in w.requests:  # many ties on the stutter's measure, the longest gap
        s.itl_max_ms = float(round(s.itl_max_ms or 0.0, -3))
    forward = _affected(write_workload(w, "forward.duckdb"))
    w.requests.reverse()
    backward = _affected(write_workload(w, "backward.duckdb"))
    assert "stutter" in forward
    ids, count = forward["stutter"]
    assert len(ids) > len(set(s.itl_max_ms for s in w.requests if s.stall_count))  # ties
    assert forward == backward


@pytest.mark.slow
def test_a_finding_says_how_many_requests_it_speaks_of(write_workload) -> None:  # type: ignore[no-untyped-def]
    w = workloads.stutter()
    stalled = sum(1 for s in w.requests if s.stall_count)
    ids, count = _affected(write_workload(w))["stutter"]
    assert count == stalled and len(ids) == min(stalled, 1000)
