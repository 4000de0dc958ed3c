"""Each complaint's workload has that complaint as its top finding; a healthy one has none."""

from __future__ import annotations

import pytest

from tokentrace.analyzer.report import build_report

from . import workloads


def test_healthy_window_has_no_finding(write_workload) -> None:  # type: ignore[no-untyped-def]
    report = build_report(write_workload(workloads.healthy()))
    assert report["requests"]["count"] > 500
    assert report["findings"] == []


@pytest.mark.slow
@pytest.mark.parametrize("complaint", sorted(workloads.SCENARIOS))
def test_scenario_top_finding(write_workload, complaint: str) -> None:  # type: ignore[no-untyped-def]
    w = workloads.SCENARIOS[complaint]()
    conn = write_workload(w)
    findings = build_report(conn)["findings"]
    assert findings, "no finding"
    summary = [(f["complaint"], f["confidence"]) for f in findings]
    assert findings[0]["complaint"] == complaint, summary
    top = findings[0]
    assert 0 < top["confidence"] <= 1
    assert top["evidence"] and all("text" in e for e in top["evidence"])
    assert top["fix_first"]
    assert 0 < len(top["affected_trace_ids"]) <= 1000
    kept = {r[0] for r in conn.execute("SELECT trace_id FROM requests WHERE kept").fetchall()}
    assert set(top["example_traces"]) <= kept
    assert set(top["example_traces"]) <= set(top["affected_trace_ids"]) or len(top["affected_trace_ids"]) == 1000
    assert all(1 <= len(f["example_traces"]) <= 5 for f in findings), summary
