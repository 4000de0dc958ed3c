"""`long_wait_then_fast`: what the first token's wait is made of, and what prompt size says of it.

`long_wait_then_fast` says the first token's wait is prefill: only requests whose
server was seen measure that.

A client-only trace (OTel GenAI / OpenLLMetry / OpenInference client spans, no server
span: flagged `server_unseen`) cannot split its wait between network, queue and
prefill, so all of it reads as prefill.  The detector used to report "100 % of it
prefill" for such streams, where the wait may as well be a cross-region hop or a queue.

`long_wait_then_fast` says TTFT grows with prompt size only where the window shows it.

A reviewer's run with every prompt 500 tokens read "TTFT grows with prompt size: p50 1.00 s
for prompts ≥ 500 tokens vs 1.00 s for ≤ 500 (correlation nan)".
"""

from __future__ import annotations

import json
import random
from typing import Any

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.report import build_report
from tokentrace.analyzer.summary import FLAG_SERVER_UNSEEN, RequestSummary

from .spanfactory import MS, genai_client_trace, sdk_trace
from .workloads import Req, Server, Workload, arrivals, serve, summarize


def _requests(make, n: int = 60) -> list[RequestSummary]:  # type: ignore[no-untyped-def]
    rng = random.Random(5)
    out = []
    for i in range(n):
        spans, _ = make(rng, 1_700_000_000 * 10**9 + round(i * 3000 * MS))
        (r,) = summarize_trace(spans).requests
        out.append(r)
    return out


def _client_only(rng: random.Random, t0: int):  # type: ignore[no-untyped-def]
    # 800 ms to the first chunk, then 20 ms a token: a long wait, then fast
    return genai_client_trace(800.0 + rng.uniform(-50, 50), 20.0, 60, style="openllmetry", t0_ns=t0)


def _server_seen(rng: random.Random, t0: int):  # type: ignore[no-untyped-def]
    return sdk_trace(1.0, 5.0, 800.0 + rng.uniform(-50, 50), 20.0, 60, t0_ns=t0)


def test_client_only_streams_claim_no_prefill(write_workload) -> None:  # type: ignore[no-untyped-def]
    requests = _requests(_client_only)
    assert all(FLAG_SERVER_UNSEEN in r.flags for r in requests)
    assert all(r.prefill_ms > 700 for r in requests)  # the unsplit wait, read as prefill
    report = build_report(write_workload(Workload(requests)))
    assert "long_wait_then_fast" not in [f["complaint"] for f in report["findings"]], report["findings"]


def test_the_same_wait_measured_at_the_server_is_found(write_workload) -> None:  # type: ignore[no-untyped-def]
    requests = _requests(_server_seen)
    assert not any(FLAG_SERVER_UNSEEN in r.flags for r in requests)
    findings = build_report(write_workload(Workload(requests)))["findings"]
    assert [f["complaint"] for f in findings][:1] == ["long_wait_then_fast"], findings


def test_mixed_traffic_is_judged_on_the_measured_requests(write_workload) -> None:  # type: ignore[no-untyped-def]
    seen = _requests(_server_seen, 30)
    unseen = _requests(_client_only, 30)
    finding = next(
        f for f in build_report(write_workload(Workload(seen + unseen)))["findings"]
        if f["complaint"] == "long_wait_then_fast"
    )
    assert finding["evidence"][0]["requests"] == len(seen)
    assert set(finding["affected_trace_ids"]) <= {r.trace_id for r in seen}


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
