"""batch_mode_breaks_live from traffic classes and request-level concurrency, where time slices
give no baseline and the engine gives no batch size (issue 22: TGI's `infer` steps carry
none, vLLM sends no steps; 9,084 of 9,584 steps read batch 0 and the finding stayed silent)."""

from __future__ import annotations

import random
from typing import Any

from tokentrace.analyzer.engine_steps import EngineStep
from tokentrace.analyzer.report import build_report

from .workloads import T0_NS, Req, S, Workload, lognormal, summarize


def _live(rng: random.Random, t: float, beside: bool) -> Req:
    """A live chat: its first token and its stream stretched while batch jobs share the engine."""
    r = Req(T0_NS + int(t * S), lognormal(rng, 300, 0.8), 60, tenant="acme", prefill_ms=30.0)
    r.queue_ms = rng.uniform(600, 1200) if beside else rng.uniform(1, 5)
    tpot = rng.uniform(50, 70) if beside else rng.uniform(18, 22)
    r.gaps_ms = [tpot for _ in range(r.output - 1)]
    return r


def _batch(rng: random.Random, t: float, seconds: float) -> Req:
    r = Req(T0_NS + int(t * S), 800, 300, tenant="nightly-eval", traffic_class="batch", prefill_ms=80.0)
    r.gaps_ms = [seconds * 1000 / (r.output - 1)] * (r.output - 1)
    return r


def batch_jobs_every_slice(seed: int = 71) -> Workload:
    """Ten minutes; a batch job of 4 s starts every 10 s, so every time slice (10 s) holds
    batch traffic, but live chats arrive with none in flight 60 % of the time."""
    rng = random.Random(seed)
    batch = [_batch(rng, t, 4.0) for t in range(0, 600, 10)]
    live = []
    for i in range(600):
        t = i + rng.uniform(0, 1)
        live.append(_live(rng, t, beside=(t % 10) < 4))
    reqs = live + batch
    return Workload(summarize(rng, reqs), raw=reqs)


def batch_never_stops(seed: int = 72) -> Workload:
    """Ten minutes of 40 batch requests always in flight (each 60 s) beside live chats, and
    engine steps that name the live requests but give no batch size (TGI's `infer`)."""
    rng = random.Random(seed)
    batch = [_batch(rng, t / 40 * 60 - 60, 60.0) for t in range(440)]
    for r in batch:  # every request waits for a seat in the engine's full batch
        r.queue_ms = rng.uniform(600, 1200)
    live = [_live(rng, i * 1.5 + rng.uniform(0, 1), beside=True) for i in range(400)]
    reqs = live + batch
    w = Workload(summarize(rng, reqs), raw=reqs)
    w.engine_steps = [
        EngineStep("llm", "i0", s.start_ns, 50_000, None, None, None, None, None, None, [s.request_id])
        for s in w.requests[: len(live)]
    ]  # fmt: skip
    return w


def _batch_mode(report: dict[str, Any]) -> dict[str, Any]:
    findings = report["findings"]
    assert findings and findings[0]["complaint"] == "batch_mode_breaks_live", [
        (f["complaint"], f["confidence"]) for f in findings
    ]
    return findings[0]


def test_live_requests_with_no_batch_request_in_flight_are_the_baseline(write_workload) -> None:  # type: ignore[no-untyped-def]
    f = _batch_mode(build_report(write_workload(batch_jobs_every_slice())))
    first = f["evidence"][0]
    assert first["text"].startswith(
        "live requests that arrived while batch requests were in flight on their instance (1 at the median): "
    ), first
    assert first["baseline_requests"] >= 300 and first["requests"] >= 200
    assert first["batch_in_flight_p50"] == 1


def test_requests_in_flight_stand_in_for_unknown_batch_sizes(write_workload) -> None:  # type: ignore[no-untyped-def]
    report = build_report(write_workload(batch_never_stops()))
    signals = report["coverage"]["signals"]
    assert signals["engine_steps"] > 0 and signals["step_batch_sizes"] == 0  # steps, sizes unknown
    f = _batch_mode(report)
    first = f["evidence"][0]
    assert "the engine gives no batch sizes, so the requests in flight stand in for them" in first["text"]
    assert first["batch_in_flight_p50"] >= 32
    # no line of batch sizes it does not know
    assert not any("batch size p50" in e["text"] for e in f["evidence"])
