"""Heavy queueing that lags behind bursts is a load finding.

A review ran ten minutes of Azure conversation arrivals through a 19-slot FIFO server:
queue 49 % of all E2E time, median wait 2.9 s, and no finding.  peak_hours compares the
busiest arrival slices with the rest, but the backlog a burst builds is waited out by
the requests after it (the busiest slices queued *less*, 39 % against 51 %), and its
saturated branch asked for the queue to be half of E2E in two thirds of the slices.
bad_in_production's low/high load comparison saw the same backlog on both sides.
"""

from __future__ import annotations

import random

import pytest

from tokentrace.analyzer.diagnosis import peak_hours
from tokentrace.analyzer.report import build_report

from . import azure_conv
from .workloads import Server, Workload, serve, summarize

pytestmark = pytest.mark.slow


def _fifo(slots: int, seed: int = 3) -> Workload:
    rng = random.Random(seed)
    reqs = azure_conv.requests()
    serve(rng, reqs, Server(slots=slots, prefill_base_ms=10.0, prefill_ms_per_token=0.02, tpot_ms=15.0, jitter=0.1))
    return Workload(summarize(rng, reqs), raw=reqs)


@pytest.mark.parametrize("slots", [19, 20])
def test_a_backlog_lagging_behind_bursts_is_peak_hours(write_workload, slots: int) -> None:  # type: ignore[no-untyped-def]
    report = build_report(write_workload(_fifo(slots)))
    # short of "the queue dominates": about a third to a half of E2E
    assert 1 / 3 < report["buckets"]["queue"]["share"] < 0.55
    findings = report["findings"]
    assert findings and findings[0]["complaint"] == "peak_hours", findings
    first, little, *rest = findings[0]["evidence"]
    assert first["text"].startswith("the median request waits ")
    assert little["queue_wait_p50_ms"] >= peak_hours.HEAVY_WAIT_MS
    assert little["queue_length_mean"] >= 0.5 * little["in_service_mean"]  # Little's law
    # why no peak: the busiest arrival slices wait no more than the rest
    lag = next(e for e in rest if "busy_queue_share" in e)
    assert lag["busy_queue_share"] <= lag["baseline_queue_share"] and lag["arrival_ratio"] >= 1.3
    assert "the backlog lags behind the bursts" in lag["text"]
    assert findings[0]["fix_first"].startswith("Add capacity")
    assert "bad_in_production" not in [f["complaint"] for f in findings]


def test_enough_capacity_for_the_bursts_is_no_load_finding(write_workload) -> None:  # type: ignore[no-untyped-def]
    report = build_report(write_workload(_fifo(32)))
    assert report["buckets"]["queue"]["share"] < 0.05
    assert report["findings"] == [], [f["complaint"] for f in report["findings"]]
