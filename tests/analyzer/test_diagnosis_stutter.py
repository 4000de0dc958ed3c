"""Stutter's prefill link counts a step only inside the stream's own decode, on the server.

A reviewer's ground-truth run: a large prefill step after a stream's last token, while the
answer was still on its way to the user, counted as "decoded beside a large prefill" (the
window was the client's start + the whole E2E).  The further the users, the more smooth
streams it took in, until the link between stalls and large prefills disappeared.
"""

from __future__ import annotations

import random

from tokentrace.analyzer.buckets import NS_PER_MS
from tokentrace.analyzer.engine_steps import EngineStep
from tokentrace.analyzer.report import build_report

from .workloads import T0_NS, Req, S, Workload, summarize

LARGE = 2000  # tokens a large prefill step prefills


def _step(t: int, took_ms: float, prefill: int, ids: list[str]) -> EngineStep:
    return EngineStep(
        "llm", "i0", t, int(took_ms * 1000), prefill, 0 if prefill else 1, 1, 0, None, None, ids
    )


def far_users_and_large_prefills(seed: int = 51, n: int = 40, tail_ms: float = 300.0) -> Workload:
    """Gives `n` streams one after another, each answer `tail_ms` on the way back to its user.
    Every fourth stream freezes for a 480 ms prefill of 2,000 tokens run in the middle of its
    decode; after every stream's last token, while its answer travels, another 2,000-token
    prefill runs.  Engine steps name the streams they decode, as the SDK's do."""
    rng = random.Random(seed)
    reqs: list[Req] = []
    steps: list[EngineStep] = []
    for i in range(n):
        # summarize places the network after the server's end: all of it is the way back
        r = Req(T0_NS + i * 3 * S, 100, 50, network_ms=tail_ms, prefill_ms=20.0)
        r.gaps_ms = [20.0 * rng.uniform(0.95, 1.05) for _ in range(r.output - 1)]
        stall_at = 25 if i % 4 == 0 else None
        if stall_at is not None:
            r.gaps_ms[stall_at] += 500.0
        rid = f"req-{i}"  # as summarize names them
        t = r.arrival_ns + int(r.tokenize_ms * NS_PER_MS)
        steps.append(_step(t, r.prefill_ms, r.prompt, [rid]))
        t += int(r.prefill_ms * NS_PER_MS)
        for k, gap in enumerate(r.gaps_ms):
            took = gap
            if k == stall_at:
                steps.append(_step(t, 480.0, LARGE, [f"long-{i}"]))
                t, took = t + int(480.0 * NS_PER_MS), gap - 480.0
            steps.append(_step(t, took, 0, [rid]))
            t += int(took * NS_PER_MS)
        # the stream's last token is out; its answer is still on the wire
        steps.append(_step(t + int(100 * NS_PER_MS), 50.0, LARGE, [f"next-{i}"]))
        reqs.append(r)
    return Workload(summarize(rng, reqs), engine_steps=steps, raw=reqs)


def test_a_prefill_after_the_last_token_froze_nothing(write_workload) -> None:  # type: ignore[no-untyped-def]
    report = build_report(write_workload(far_users_and_large_prefills()))
    f = next(f for f in report["findings"] if f["complaint"] == "stutter")
    linked = f["evidence"][1]
    assert linked["large_prefill_tokens"] <= LARGE
    # every frozen stream froze beside one; no smooth stream decoded beside one
    assert linked["stalled_with_large_prefill"] == 1.0, linked["text"]
    assert linked["smooth_with_large_prefill"] == 0.0, linked["text"]
    assert f["fix_first"].startswith("Enable chunked prefill"), f["fix_first"]
