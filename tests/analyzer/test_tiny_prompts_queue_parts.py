"""`tiny_prompts_slow` with every prompt one size: the queue's parts pick the advice, and a
saturated server's queue is load, not a tiny-prompt problem.

Shapes from a reviewer's ground-truth server: a tokenizer that takes 300 ms with nobody
waiting (it was told "cap queue depth"), a scheduler that holds each request 500 ms, and
an open-loop load above capacity (reported as peak_hours and, again, as tiny prompts).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from tokentrace.analyzer.report import build_report

from .workloads import Req, Server, Workload, arrivals, serve, summarize


def _one_size(
    seed: int, rate: float, seconds: float, slots: int, shape: Callable[[random.Random, Req], None]
) -> Workload:
    """Gives requests of one prompt size (20 tokens, 32 out) near their server, each bent by `shape`."""
    rng = random.Random(seed)
    reqs = [
        Req(a, 20, 32, network_ms=rng.uniform(2, 10))
        for a in arrivals(rng, seconds, lambda t: rate)
    ]
    for r in reqs:
        shape(rng, r)
    serve(rng, reqs, Server(slots=slots))
    return Workload(summarize(rng, reqs), raw=reqs)


def _slow_tokenizer(rng: random.Random, r: Req) -> None:
    r.tokenize_ms = rng.uniform(280, 320)


def _scheduler_hold(rng: random.Random, r: Req) -> None:
    r.queue_ms = rng.uniform(480, 520)  # held before admission, whatever the load


def _findings(w: Workload, write_workload: Any) -> dict[str, dict[str, Any]]:
    report = build_report(write_workload(w))
    json.dumps(report, allow_nan=False)
    return {f["complaint"]: f for f in report["findings"]}


def test_a_slow_tokenizer_is_told_about_the_tokenizer_not_queue_depth(write_workload) -> None:  # type: ignore[no-untyped-def]
    f = _findings(_one_size(31, 0.5, 300, 16, _slow_tokenizer), write_workload)["tiny_prompts_slow"]
    assert f["fix_first"].startswith("Tokenization is "), f["fix_first"]
    assert "cap queue depth" not in f["fix_first"] and "Then:" not in f["fix_first"], f["fix_first"]
    parts = next(e for e in f["evidence"] if "queue_part" in e)
    assert parts["queue_part"] == "tokenize"
    assert parts["text"].endswith("most of it is tokenization"), parts["text"]
    assert parts["overhead_bound_tokenize_mean_ms"] > 250
    # the parts are the queue's time in the wait: they add up to it
    split = f["evidence"][1]
    total = sum(parts[f"overhead_bound_{p}_mean_ms"] for p in ("queue_wait", "tokenize", "other"))
    assert abs(total - split["overhead_bound_queue_mean_ms"]) < 1e-3


def test_a_scheduler_hold_is_told_about_the_scheduler_then_queue_depth(write_workload) -> None:  # type: ignore[no-untyped-def]
    found = _findings(_one_size(32, 0.5, 300, 16, _scheduler_hold), write_workload)
    # a fixed hold at low load is no saturation: no load finding takes it over
    assert "peak_hours" not in found, list(found)
    f = found["tiny_prompts_slow"]
    assert f["fix_first"].startswith("Waiting for the scheduler is "), f["fix_first"]
    assert f["fix_first"].endswith(". Then: cap queue depth."), f["fix_first"]
    parts = next(e for e in f["evidence"] if "queue_part" in e)
    assert parts["queue_part"] == "queue_wait" and parts["text"].endswith(
        "most of it is scheduler wait"
    )
    # tokenization (~1 ms of ~500) reads "0 %": a part that says nothing is not said
    assert "tokenization" not in parts["text"] and " 0 % " not in parts["text"], parts["text"]


def test_overload_with_one_prompt_size_is_load_not_tiny_prompts(write_workload) -> None:  # type: ignore[no-untyped-def]
    # 7 requests a second into 4 slots that serve ~6: the backlog grows for the whole window
    w = _one_size(33, 7.0, 40, 4, lambda rng, r: None)
    assert len({s.prompt_tokens for s in w.requests}) == 1
    found = _findings(w, write_workload)
    assert "peak_hours" in found, list(found)
    # with no larger prompts to compare, the saturated queue is peak_hours' alone
    assert "tiny_prompts_slow" not in found, found.get("tiny_prompts_slow", {}).get("evidence")
