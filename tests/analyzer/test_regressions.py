"""Shapes from real demo runs that a detector once got wrong, each kept as a scenario."""

from __future__ import annotations

from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.report import build_report

from . import workloads


def test_cpu_contention_is_not_stutter(write_workload) -> None:  # type: ignore[no-untyped-def]
    w = workloads.cpu_contention()
    stalled = sum(1 for s in w.requests if s.stall_count)
    # the shape is the one that fooled the detector: many streams with a gap > 4x their median
    assert stalled / len(w.requests) > 0.12
    findings = build_report(write_workload(w))["findings"]
    assert [f["complaint"] for f in findings] == []


def _complaints(conn, filters: Filters | None = None) -> list[str]:  # type: ignore[no-untyped-def]
    return [f["complaint"] for f in build_report(conn, filters)["findings"]]


def test_one_cold_request_on_one_instance_is_no_cold_start(write_workload) -> None:  # type: ignore[no-untyped-def]
    conn = write_workload(workloads.two_services())
    # the other service's pods must not count towards this service's instances
    assert "cold_start" not in _complaints(conn, Filters(service="solo"))
    fleet = build_report(conn, Filters(service="fleet"))["findings"]
    assert fleet and fleet[0]["complaint"] == "cold_start"
    assert fleet[0]["evidence"][0]["instances"] == 3
    assert "cold_start" in _complaints(conn)
