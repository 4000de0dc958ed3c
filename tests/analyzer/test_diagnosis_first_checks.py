"""tiny_prompts_slow, long_wait_then_fast and stutter read their medians only past their first check.

Each signal's first check is cheap (counts, sums, or two medians of the tiny prompts alone);
the medians behind the rest of its evidence read every request, several CPU-seconds at 10 M
requests.  A window that fails the first check runs none of them; a window that has the
complaint runs them and is found as before (test_diagnosis_scenarios holds the findings).
"""

from __future__ import annotations

import pytest
from statement_recorder import StatementRecorder

from tokentrace.analyzer import queries
from tokentrace.analyzer.diagnosis._base import compose
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.report import build_report

from . import workloads

#: Each signal's query of medians, by the complaint it reads them for.
MEDIANS = {
    "tiny_prompts_slow": "diag_tiny_prompts",
    "long_wait_then_fast": "diag_prefill",
    "stutter": "diag_stutter",
}
#: Windows that fail a first check: a healthy window (tiny prompts waiting little, a short
#: wait for the first token, no frozen stream), and one whose wait is mostly queue.
FAILS_FIRST_CHECK = [
    ("tiny_prompts_slow", "healthy"),
    ("long_wait_then_fast", "healthy"),
    ("long_wait_then_fast", "peak_hours"),
    ("stutter", "healthy"),
]


def _ran(conn, name: str) -> tuple[bool, list[str]]:  # type: ignore[no-untyped-def]
    """Builds the report through a recording cursor; gives whether named query `name` ran
    (over the report's whole window) and the complaints found."""
    recorder = StatementRecorder(conn)
    findings = build_report(recorder)["findings"]  # type: ignore[arg-type]
    sql = compose(Filters().cte()[0], queries.load(name))
    return any(s == sql for s, _ in recorder.statements), [f["complaint"] for f in findings]


@pytest.mark.parametrize(("complaint", "window"), FAILS_FIRST_CHECK)
def test_a_window_failing_the_first_check_reads_no_median(
    write_workload, complaint: str, window: str
) -> None:  # type: ignore[no-untyped-def]
    ran, found = _ran(write_workload(getattr(workloads, window)()), MEDIANS[complaint])
    assert complaint not in found, found
    assert not ran, f"{MEDIANS[complaint]} ran in a window whose first check fails"


@pytest.mark.slow
@pytest.mark.parametrize("complaint", sorted(MEDIANS))
def test_a_window_with_the_complaint_reads_them(write_workload, complaint: str) -> None:  # type: ignore[no-untyped-def]
    ran, found = _ran(write_workload(workloads.SCENARIOS[complaint]()), MEDIANS[complaint])
    assert complaint in found, found
    assert ran
