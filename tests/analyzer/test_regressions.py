"""Shapes from real demo runs that a detector once got wrong, each kept as a scenario."""

from __future__ import annotations

from tokentrace.analyzer.report import build_report

from . import workloads


def test_cpu_contention_is_not_stutter(write_workload) -> None:  # type: ignore[no-untyped-def]
    w = workloads.cpu_contention()
    stalled = sum(1 for s in w.requests if s.stall_count)
    # the shape is the one that fooled the detector: many streams with a gap > 4x their median
    assert stalled / len(w.requests) > 0.12
    findings = build_report(write_workload(w))["findings"]
    assert [f["complaint"] for f in findings] == []
