"""Stutter without engine steps (vLLM and TGI send none): the freeze is read from the streams'
own gaps, and its likely cause from the requests themselves: another request on the same
instance whose long prefill ran while the stream decoded (issue 22)."""

from __future__ import annotations

import random
from typing import Any

from tokentrace.analyzer.buckets import NS_PER_MS
from tokentrace.analyzer.report import build_report

from .workloads import T0_NS, Req, S, Workload, summarize

PREFILL_MS = 600.0  # a 4,000-token prompt prefilled whole


def streams_beside_long_prompts(seed: int = 61, long_instance: str = "i0", stall_at_prefills: bool = True) -> Workload:
    """Gives 120 chat streams over ten minutes and 40 long prompts, all on instance i0 unless
    `long_instance` says otherwise.  A stream that decodes while a long prompt is prefilled
    freezes for the prefill (`stall_at_prefills`); else as many streams freeze at random
    times, beside no prefill."""
    rng = random.Random(seed)
    longs = []
    for _ in range(40):
        r = Req(T0_NS + int(rng.uniform(0, 600) * S), 4000, 2, prefill_ms=PREFILL_MS, instance=long_instance)
        r.gaps_ms = [20.0]
        longs.append(r)
    windows = [
        (r.arrival_ns + int((r.tokenize_ms + r.queue_ms) * NS_PER_MS), PREFILL_MS) for r in longs
    ]  # fmt: skip
    streams = []
    for i in range(120):
        r = Req(T0_NS + i * 5 * S + int(rng.uniform(0, 2) * S), 60, 100, prefill_ms=15.0)
        r.gaps_ms = [20.0 * rng.uniform(0.95, 1.05) for _ in range(r.output - 1)]
        t = r.arrival_ns + int((r.tokenize_ms + r.prefill_ms) * NS_PER_MS)
        for k, gap in enumerate(r.gaps_ms):
            end = t + int(gap * NS_PER_MS)
            if any(p0 < end and p0 + took * NS_PER_MS > t for p0, took in windows):
                if stall_at_prefills:
                    r.gaps_ms[k] += PREFILL_MS
                break
            t = end
        streams.append(r)
    if not stall_at_prefills:  # the same number of freezes, at random, beside no prefill
        frozen = sum(1 for r in streams_beside_long_prompts(seed).raw if max(r.gaps_ms) > 100)
        for r in rng.sample(streams, frozen):
            r.gaps_ms[rng.randrange(10, 90)] += PREFILL_MS
    reqs = streams + longs
    return Workload(summarize(rng, reqs), raw=reqs)


def _stutter(report: dict[str, Any]) -> dict[str, Any]:
    findings = report["findings"]
    assert findings and findings[0]["complaint"] == "stutter", [(f["complaint"], f["confidence"]) for f in findings]
    return findings[0]


def test_stalls_beside_other_requests_prefills_lead_to_chunked_prefill(write_workload) -> None:  # type: ignore[no-untyped-def]
    report = build_report(write_workload(streams_beside_long_prompts()))
    assert report["coverage"]["signals"]["engine_steps"] == 0
    f = _stutter(report)
    line = f["evidence"][1]
    assert "no engine steps in this window, so requests stand in" in line["text"], line
    assert line["stalled_with_long_prefill"] >= 0.8 and line["smooth_with_long_prefill"] <= 0.2, line
    assert line["prompt_tokens_p50"] == 4000 and line["prefill_p50_ms"] == PREFILL_MS
    assert f["fix_first"].startswith("Enable chunked prefill, with a per-step token budget well below the ~4000-token prompts")


def test_long_prefills_of_another_instance_froze_nobody_here(write_workload) -> None:  # type: ignore[no-untyped-def]
    # the same freezes, but the long prompts ran on another replica: no cause named
    w = streams_beside_long_prompts(long_instance="i1")
    for s in w.requests:
        if s.output_tokens == 100:
            s.instance = "i0"
    f = _stutter(build_report(write_workload(w)))
    line = f["evidence"][1]
    assert line["stalled_with_long_prefill"] == 0, line
    assert "the freezes have another cause" in line["text"], line
    assert not f["fix_first"].startswith("Enable chunked prefill")
    # the advice follows the evidence: not the engine's batching first
    assert f["fix_first"].startswith("Look outside the engine first"), f["fix_first"]


def test_freezes_at_random_times_are_not_blamed_on_prefills(write_workload) -> None:  # type: ignore[no-untyped-def]
    f = _stutter(build_report(write_workload(streams_beside_long_prompts(stall_at_prefills=False))))
    line = f["evidence"][1]
    assert line["stalled_with_long_prefill"] - line["smooth_with_long_prefill"] < 0.15, line
    assert not f["fix_first"].startswith("Enable chunked prefill")
