"""Each finding shows its best kept traces, preferring ones no higher-ranked finding shows."""

from __future__ import annotations

from tokentrace.analyzer.diagnosis._base import MAX_EXAMPLES, Finding, pick_examples


def _finding(complaint: str, candidates: list[str]) -> Finding:
    return Finding(complaint, 0.9, 0.5, [], affected_trace_ids=candidates, example_traces=candidates)


def test_overlapping_findings_show_different_traces() -> None:
    shared = [f"t{i:02d}" for i in range(20)]  # the same most-queued requests first in both
    top, second = _finding("peak_hours", shared), _finding("big_tenants_slower", shared[:3] + shared)
    pick_examples([top, second])
    assert top.example_traces == shared[:MAX_EXAMPLES]
    assert second.example_traces == shared[MAX_EXAMPLES : 2 * MAX_EXAMPLES]


def test_a_finding_with_too_few_traces_of_its_own_still_shows_its_best() -> None:
    top = _finding("peak_hours", ["a", "b", "c", "d", "e"])
    second = _finding("bad_in_production", ["c", "x", "a", "b", "d", "e"])
    pick_examples([top, second])
    assert top.example_traces == ["a", "b", "c", "d", "e"]
    # "x" is its only own trace; the rest is filled by its best, in its own order
    assert second.example_traces == ["c", "x", "a", "b", "d"]


def test_no_finding_shows_more_than_the_limit() -> None:
    findings = [_finding(c, [f"{c}{i}" for i in range(50)]) for c in ("stutter", "cold_start")]
    pick_examples(findings)
    assert [len(f.example_traces) for f in findings] == [MAX_EXAMPLES, MAX_EXAMPLES]
