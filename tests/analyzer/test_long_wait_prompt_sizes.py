"""`long_wait_then_fast` says TTFT grows with prompt size only where the window shows it.

A reviewer's run with every prompt 500 tokens read "TTFT grows with prompt size: p50 1.00 s
for prompts ≥ 500 tokens vs 1.00 s for ≤ 500 (correlation nan)".
"""

from __future__ import annotations

import json
import random
from typing import Any

from tokentrace.analyzer.report import build_report

from .workloads import Req, Server, Workload, arrivals, serve, summarize


def _rag(seed: int, prompt: Any, prefill: Any = None) -> Workload:
    """Gives long-prompt requests on a quiet server: the wait for the first token is the
    prefill (0.4 ms a token, or `prefill(prompt)` ms)."""
    rng = random.Random(seed)
    reqs = [
        Req(a, prompt(rng), 32, network_ms=rng.uniform(2, 10))
        for a in arrivals(rng, 600, lambda t: 0.3)
    ]
    serve(rng, reqs, Server(slots=8, prefill_ms_per_token=0.4, tpot_ms=18.0))
    if prefill is not None:
        for r in reqs:
            r.prefill_ms = prefill(r.prompt) * rng.uniform(0.95, 1.05)
    return Workload(summarize(rng, reqs), raw=reqs)


def _long_wait(w: Workload, write_workload: Any) -> dict[str, Any]:
    report = build_report(write_workload(w))
    json.dumps(report, allow_nan=False)  # raises on NaN anywhere in the report
    return next(f for f in report["findings"] if f["complaint"] == "long_wait_then_fast")


def _prompt_line(f: dict[str, Any]) -> dict[str, Any] | None:
    return next((e for e in f["evidence"] if "prompt_ttft_corr" in e), None)


def test_one_prompt_size_says_nothing_of_prompt_size(write_workload) -> None:  # type: ignore[no-untyped-def]
    f = _long_wait(_rag(41, lambda rng: 2500), write_workload)
    assert _prompt_line(f) is None, f["evidence"]
    assert not any("nan" in e["text"] for e in f["evidence"]), f["evidence"]


def test_ttft_falling_with_prompt_size_is_not_said_to_grow(write_workload) -> None:  # type: ignore[no-untyped-def]
    # a server whose longer prompts hit a prefix cache: the longer, the sooner
    w = _rag(42, lambda rng: rng.randint(1500, 4000), prefill=lambda tokens: 3000.0 - 0.5 * tokens)
    f = _long_wait(w, write_workload)
    assert _prompt_line(f) is None, f["evidence"]


def test_ttft_growing_with_prompt_size_is_said(write_workload) -> None:  # type: ignore[no-untyped-def]
    f = _long_wait(_rag(43, lambda rng: rng.randint(1500, 4000)), write_workload)
    line = _prompt_line(f)
    assert line is not None and line["prompt_ttft_corr"] > 0.5, f["evidence"]
    assert line["long_prompt_tokens"] > line["short_prompt_tokens"]
    assert line["text"].startswith("TTFT grows with prompt size: ")
