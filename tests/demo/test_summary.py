"""The demo's per-scenario lines read as the report does (no demo run needed)."""

from __future__ import annotations

from tokentrace.demo_cli import summarize_findings


def _report(count: int, kept: int, confidence: float) -> dict[str, object]:
    finding = {
        "complaint": "stutter", "title": "It starts responding, then freezes or stutters",
        "confidence": confidence, "evidence": [{"text": "e1"}], "fix_first": "f", "example_traces": [],
    }  # fmt: skip
    return {"requests": {"count": count, "kept_traces": kept}, "findings": [finding]}


def test_counts_in_the_singular_and_confidence_as_a_percent() -> None:
    lines = summarize_findings(_report(1, 1, 0.7153))
    assert lines[0] == "  1 request traced, 1 full trace kept"
    assert lines[1].endswith("(confidence 72 %)")  # as the report and the explorer say it
    assert summarize_findings(_report(36, 0, 0.5))[0] == "  36 requests traced, 0 full traces kept"
