"""A server overloaded the whole window: the queue is the story even with no quiet slices.

From a real run: a CPU tiny-LLM server under a load generator sending more than it
could serve, 160 requests, E2E p95 11.57 s, queue 73 % of E2E (all of it queue
wait), and 117 ms hiccups beside prefills.  peak_hours needs quiet slices to contrast
the busy ones with, gpu_saturation needs GPU samples: the report's only finding was
the hiccups, and it said nothing of ten seconds of queueing.

Also here: bad_in_production is found only between environments the traces name (issue
22: load levels within one deployment are no "fine locally, bad in production"), the
report's coverage says what the traces lack instead, and peak_hours says how long its peak is.
"""

from __future__ import annotations

import heapq
import random
import re
from typing import Any

import pytest

from tokentrace.analyzer.buckets import NS_PER_MS
from tokentrace.analyzer.diagnosis import peak_hours
from tokentrace.analyzer.diagnosis._base import Context
from tokentrace.analyzer.engine_steps import EngineStep
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.report import build_report

from . import workloads
from .workloads import T0_NS, Req, S, Server, Workload, lognormal, serve, summarize

#: the real run's hiccup: a prefill of a long prompt run whole beside the decodes
HICCUP_MS = 117.0


def _load_test(rng: random.Random, seconds: float, per_s: float, output: tuple[int, int]) -> list[Req]:
    """A load generator at a fixed rate (arrivals evenly spaced, a little jitter)."""
    gap = 1 / per_s
    return [
        Req(T0_NS + int((i * gap + rng.uniform(0, 0.4 * gap)) * S), lognormal(rng, 200, 0.5),
            rng.randint(*output), network_ms=rng.uniform(2, 6))
        for i in range(int(seconds * per_s))
    ]


def overloaded_cpu_server(seed: int = 31, hiccups: bool = True) -> Workload:
    """Arrivals 4.5 % above what two decode slots serve, for four minutes: the backlog
    starts empty and grows all along to about ten seconds of queue wait."""
    rng = random.Random(seed)
    server = Server(slots=2, prefill_ms_per_token=0.5, prefill_base_ms=20.0, tpot_ms=20.0, jitter=0.1)
    compute_s = (server.prefill_base_ms + server.prefill_ms_per_token * 200 + server.tpot_ms * 99) / 1000
    reqs = _load_test(rng, 245, 1.045 * server.slots / compute_s, (80, 120))
    serve(rng, reqs, server)
    steps: list[EngineStep] = []
    if hiccups:
        big = sorted(T0_NS + int(rng.uniform(0, 250) * S) for _ in range(40))
        steps += [EngineStep("llm", "i0", b, int(HICCUP_MS * 1000), 900, 2, 2, 4, 0.5) for b in big]
        steps += [EngineStep("llm", "i0", T0_NS + t * S, 20_000, rng.choice([0, 0, 60, 120]), 2, 2, 4, 0.4)
                  for t in range(0, 250, 2)]
        for r in reqs:
            t = r.arrival_ns + int((r.tokenize_ms + r.queue_ms + r.prefill_ms) * NS_PER_MS)
            for i, g in enumerate(r.gaps_ms):
                if any(t <= b < t + int((g + HICCUP_MS) * NS_PER_MS) for b in big):
                    r.gaps_ms[i] = g + HICCUP_MS * rng.uniform(0.9, 1.1)
                t += int(r.gaps_ms[i] * NS_PER_MS)
    return Workload(summarize(rng, reqs), engine_steps=steps, raw=reqs)


def closed_loop(seed: int = 32, clients: int = 12, slots: int = 2, tpot_ms: float = 20.0) -> Workload:
    """A closed-loop client holding 12 requests in flight on a 2-slot server: each sends
    its next request when the last one ends, so the backlog is steady, never growing."""
    rng = random.Random(seed)
    server = Server(slots=slots, tpot_ms=tpot_ms, jitter=0.1)
    free = [T0_NS] * slots
    nxt = [(T0_NS + int(rng.uniform(0, 0.5) * S), c) for c in range(clients)]
    heapq.heapify(nxt)
    reqs: list[Req] = []
    while nxt and nxt[0][0] < T0_NS + 600 * S:
        at, c = heapq.heappop(nxt)
        r = Req(at, lognormal(rng, 300, 0.5), rng.randint(40, 60), network_ms=rng.uniform(2, 6))
        r.prefill_ms = server.prefill_base_ms + server.prefill_ms_per_token * r.prompt
        r.gaps_ms = [server.tpot_ms * rng.uniform(0.9, 1.1) for _ in range(r.output - 1)]
        start = max(heapq.heappop(free), at + int(r.tokenize_ms * NS_PER_MS))
        r.queue_ms = (start - at) / NS_PER_MS - r.tokenize_ms
        end = start + int((r.prefill_ms + r.decode_ms) * NS_PER_MS)
        heapq.heappush(free, end)
        heapq.heappush(nxt, (end + int(r.network_ms * NS_PER_MS), c))
        reqs.append(r)
    return Workload(summarize(rng, reqs), raw=reqs)


def _by_complaint(findings: list[dict]) -> dict[str, dict]:
    return {f["complaint"]: f for f in findings}


# --- 1. saturated throughout -------------------------------------------------------------------


def test_a_server_overloaded_throughout_leads_with_its_queue(write_workload) -> None:  # type: ignore[no-untyped-def]
    w = overloaded_cpu_server(hiccups=False)
    report = build_report(write_workload(w))
    # the shape of the real run: a few hundred requests, seconds of queue wait, most of E2E
    assert report["buckets"]["queue"]["share"] > 0.6
    assert 8_000 < report["latency"]["e2e"]["p95"] < 20_000
    findings = report["findings"]
    assert findings and findings[0]["complaint"] == "peak_hours", findings
    top = findings[0]
    first, little, trend = top["evidence"]
    # it says what it measured: the share in (nearly) every slice, the slice length, no contrast
    assert first["queue_share"] > 0.6 and first["slice_seconds"] == 5
    assert first["queue_dominated_slices"] >= 2 / 3 * first["slices"]
    # the count and the length apart: "of the window's 49 slices (5 s each", not "49 5-second slices"
    assert re.search(r"of the window's \d+ slices \(5 s each; median slice \d+ %\)", first["text"]), first["text"]
    assert "accepts more work than it serves" in first["text"]
    assert "busiest 10 %" not in first["text"]
    # Little's law: more waiting than being served; the wait dwarfs the compute it waits for
    assert little["queue_length_mean"] > little["in_service_mean"]
    assert little["queue_wait_p50_ms"] > 2 * little["compute_p50_ms"]
    # arrivals above the service rate: the backlog grows from the first fifth to the last
    assert trend["backlog"] == "growing"
    assert trend["last_queue_wait_p50_ms"] > 3 * trend["first_queue_wait_p50_ms"]
    assert top["fix_first"].startswith("Add capacity"), top["fix_first"]
    assert set(top["example_traces"]) <= set(top["affected_trace_ids"])
    # no other load story told beside it
    assert "bad_in_production" not in _by_complaint(findings)


def test_a_load_tests_burst_is_told_by_its_queue_too(write_workload) -> None:  # type: ignore[no-untyped-def]
    """The newcomer's first run as it was: 100 requests sent within two seconds and 60
    more a few seconds later, drained by two slots for seconds: arrivals in a handful of
    slices, too few for a peak's contrast, and the queue most of every request."""
    rng = random.Random(33)
    server = Server(slots=2, prefill_ms_per_token=0.5, prefill_base_ms=20.0, tpot_ms=20.0, jitter=0.1)
    reqs = _load_test(rng, 2, 50, (80, 120))
    later = _load_test(rng, 2, 30, (80, 120))
    for r in later:
        r.arrival_ns += 12 * S
    reqs += later
    serve(rng, reqs, server)
    report = build_report(write_workload(Workload(summarize(rng, reqs), raw=reqs)))
    findings = report["findings"]
    assert findings and findings[0]["complaint"] == "peak_hours", findings
    first = findings[0]["evidence"][0]
    assert first["slices"] < peak_hours.MIN_SLICES and first["queue_share"] > 0.5
    assert findings[0]["fix_first"].startswith("Add capacity")


def test_a_short_window_of_few_requests_says_nothing_of_saturation(write_workload) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(34)
    server = Server(slots=2, prefill_ms_per_token=0.5, prefill_base_ms=20.0, tpot_ms=20.0, jitter=0.1)
    reqs = _load_test(rng, 1, 30, (80, 120))  # 30 requests: below the short window's bar
    serve(rng, reqs, server)
    report = build_report(write_workload(Workload(summarize(rng, reqs), raw=reqs)))
    assert "peak_hours" not in _by_complaint(report["findings"])


def test_seconds_of_queueing_outrank_117_ms_hiccups(write_workload) -> None:  # type: ignore[no-untyped-def]
    findings = build_report(write_workload(overloaded_cpu_server()))["findings"]
    found = _by_complaint(findings)
    # the hiccups are real and still reported, with the prefills beside them ...
    stutter = found["stutter"]
    assert stutter["evidence"][0]["stalled_itl_max_p50_ms"] < 200
    assert stutter["fix_first"].startswith("Enable chunked prefill")
    # ... but ten seconds of queue wait come first
    assert findings[0]["complaint"] == "peak_hours", [(f["complaint"], f["confidence"]) for f in findings]
    assert found["peak_hours"]["evidence"][1]["queue_wait_p95_ms"] > 50 * HICCUP_MS


def test_a_closed_loop_client_keeps_a_steady_backlog(write_workload) -> None:  # type: ignore[no-untyped-def]
    findings = build_report(write_workload(closed_loop()))["findings"]
    assert findings and findings[0]["complaint"] == "peak_hours", findings
    first, little, trend = findings[0]["evidence"]
    # no ramp, no quiet slice: every slice waits
    assert first["queue_dominated_slices"] == first["slices"]
    assert "every one of the window's" in first["text"]
    # 12 in flight on 2 slots: about 10 wait while 2 are served
    assert 8 < little["queue_length_mean"] < 11 and 1.5 < little["in_service_mean"] <= 2.01
    assert trend["backlog"] == "steady" and "steady backlog" in trend["text"]


@pytest.mark.slow
def test_short_waits_are_not_saturation(write_workload) -> None:  # type: ignore[no-untyped-def]
    # a closed loop of short requests (~120 ms): the queue is most of E2E in every slice,
    # but a person waits less than 250 ms for it: nothing worth a finding
    w = closed_loop(clients=5, tpot_ms=1.5)
    waits = sorted(s.queue_wait_ms for s in w.requests)
    assert 50 < waits[len(waits) // 2] < 250
    assert sorted(s.queue_wait_ms / s.e2e_ms for s in w.requests)[len(w.requests) // 2] > 0.5
    assert "peak_hours" not in _by_complaint(build_report(write_workload(w))["findings"])


def test_saturation_in_production_only_is_told_by_environment(write_workload) -> None:  # type: ignore[no-untyped-def]
    # production overloaded the whole time next to a quiet staging: the window as a whole
    # is saturated, but the environments are the better evidence and say where
    rng = random.Random(33)
    prod = overloaded_cpu_server(hiccups=False).raw
    staging = [Req(T0_NS + int(rng.uniform(0, 245) * S), lognormal(rng, 200, 0.5), rng.randint(80, 120),
                   network_ms=3.0, environment="staging", instance="s0") for _ in range(60)]
    serve(rng, staging, Server(slots=2, prefill_ms_per_token=0.5, prefill_base_ms=20.0, tpot_ms=20.0))
    for r in prod:
        r.environment = "production"
    conn = write_workload(Workload(summarize(rng, prod + staging)))
    saturated = peak_hours.detect(Context(conn, Filters()))
    assert saturated is not None and "accepts more work than it serves" in saturated.evidence[0]["text"]
    findings = build_report(conn)["findings"]
    assert findings and findings[0]["complaint"] == "bad_in_production", findings
    assert "production" in findings[0]["evidence"][0]["text"]
    assert "peak_hours" not in _by_complaint(findings)


# --- 2. bad_in_production: only between environments; otherwise the coverage says why ---------


def _with_environments(w: Workload, *names: str) -> Workload:
    for i, s in enumerate(w.requests):
        s.environment = names[i % len(names)]
    return w


def _missing(report: dict[str, Any], complaint: str) -> str:
    (check,) = [c for c in report["coverage"]["complaints"] if c["complaint"] == complaint]
    assert not check["checkable"], check
    return str(check["missing"])


def test_one_environment_is_no_contrast(write_workload) -> None:  # type: ignore[no-untyped-def]
    report = build_report(write_workload(_with_environments(workloads.peak_hours(), "staging")))
    assert "bad_in_production" not in _by_complaint(report["findings"])
    missing = _missing(report, "bad_in_production")
    assert "only one environment (staging) on the traces" in missing, missing
    assert "deployment.environment.name" in missing


@pytest.mark.slow
def test_environments_without_production_are_named(write_workload) -> None:  # type: ignore[no-untyped-def]
    report = build_report(write_workload(_with_environments(workloads.peak_hours(), "staging", "dev")))
    assert "bad_in_production" not in _by_complaint(report["findings"])
    missing = _missing(report, "bad_in_production")
    assert "no production among the traces' environments (" in missing, missing
    assert "staging" in missing and "dev" in missing


def test_no_environment_says_what_would_decide_it(write_workload) -> None:  # type: ignore[no-untyped-def]
    # one tenant's bursts load the server: a load contrast, but no deployment contrast
    report = build_report(write_workload(workloads.tenant_bursts()))
    assert "bad_in_production" not in _by_complaint(report["findings"])
    missing = _missing(report, "bad_in_production")
    assert missing.startswith("no deployment.environment on the traces: tag"), missing


@pytest.mark.slow
def test_the_load_contrast_is_peak_hours_alone(write_workload) -> None:  # type: ignore[no-untyped-def]
    conn = write_workload(_with_environments(workloads.peak_hours(), "staging"))
    findings = build_report(conn)["findings"]
    assert [f["complaint"] for f in findings] == ["peak_hours"], findings


# --- 3. peak_hours says how long its peak is ------------------------------------------------------


@pytest.mark.slow
def test_peak_evidence_says_how_long_the_peak_and_the_window_are(write_workload) -> None:  # type: ignore[no-untyped-def]
    f = _by_complaint(build_report(write_workload(workloads.peak_hours()))["findings"])["peak_hours"]
    first = f["evidence"][0]
    assert first["slice_seconds"] == 20 and first["busy_slices"] == 6
    assert first["peak_seconds"] == 120 and 1150 < first["window_seconds"] < 1260
    assert "in the busiest 10 % of 20-second slices (6 slices: 2 min of this 20 min window)" in first["text"]
