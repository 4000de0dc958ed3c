"""vLLM: one row per call the user made (docs/conventions.md, "Fan-out"), and TTFT
(server) on the engine's clock (queue + prefill; "Which clock")."""

from __future__ import annotations

from typing import Any

import pytest

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import KIND_CLIENT, KIND_SERVER, Span

from . import spanfactory as f


def _prompt(tid: str, parent: Span | None, request_id: str, *, start: float = 0.0,
            queue: float = 5.0, prefill: float = 20.0, decode: float = 100.0,
            prompt: int = 14, tokens: int = 12, front_end_ttft: float | None = None) -> Span:
    """One `llm_request` span as `do_tracing` makes it; `front_end_ttft` (ms): vLLM's own
    TTFT, the front end's clock, which may differ from e2e − decode."""
    e2e = queue + prefill + decode + 1.0
    attrs: dict[str, Any] = {
        "gen_ai.latency.time_to_first_token": (front_end_ttft or e2e - decode) / 1000,
        "gen_ai.latency.e2e": e2e / 1000,
        "gen_ai.latency.time_in_queue": queue / 1000,
        "gen_ai.latency.time_in_model_prefill": prefill / 1000,
        "gen_ai.latency.time_in_model_decode": decode / 1000,
        "gen_ai.latency.time_in_model_inference": (prefill + decode) / 1000,
        "gen_ai.usage.prompt_tokens": prompt,
        "gen_ai.usage.completion_tokens": tokens,
        "gen_ai.request.id": request_id,
        "gen_ai.request.n": 1,
    }
    return f.span(tid, "llm_request", start, e2e, parent, kind=KIND_SERVER, attrs=attrs,
                  resource=dict(f.VLLM_RESOURCE))


def _caller(tid: str, dur: float = 300.0) -> Span:
    return f.span(tid, "POST", -2.0, dur, kind=KIND_CLIENT, attrs={"http.method": "POST"},
                  resource={"service.name": "app"})


def test_the_prompts_of_one_completions_call_are_one_row() -> None:
    tid = f.new_id(32)
    post = _caller(tid)
    spans = [post,
             _prompt(tid, post, "cmpl-abc-0", prompt=14, decode=100.0),
             _prompt(tid, post, "cmpl-abc-1", start=1.0, prompt=18, decode=130.0, tokens=14),
             _prompt(tid, post, "cmpl-abc-2", start=2.0, prompt=17, decode=90.0)]  # fmt: skip
    (r,) = summarize_trace(spans).requests
    assert r.request_id == "cmpl-abc"
    # what the call's `usage` says: every prompt's tokens, every answer's
    assert (r.prompt_tokens, r.output_tokens) == (14 + 18 + 17, 12 + 14 + 12)
    # the call took as long as its last prompt: from the first arrival to the last end
    assert r.server_ms == pytest.approx(1.0 + 5 + 20 + 130 + 1)
    assert r.e2e_ms == pytest.approx(300.0) and r.network_ms == pytest.approx(300.0 - r.server_ms)
    assert r.tpot_ms == pytest.approx(r.decode_ms / 13)  # the longest stream's tokens
    assert r.ttft_ms == pytest.approx(r.queue_ms + r.prefill_ms)


def test_prompts_with_several_samples_count_each_prompt_once() -> None:
    tid = f.new_id(32)
    post = _caller(tid)
    spans = [post] + [_prompt(tid, post, f"cmpl-x-{i}", prompt=10 + i) for i in (0, 1) for _ in (0, 1)]
    (r,) = summarize_trace(spans).requests
    assert (r.prompt_tokens, r.output_tokens) == (10 + 11, 4 * 12)


@pytest.mark.parametrize(
    "ids",
    [
        ["cmpl-abc-1", "cmpl-abc-2"],  # no prompt 0: not the prompts of one call
        ["cmpl-abc-0", "cmpl-abc-0x"],  # not an index
        ["chatcmpl-n2-001", "chatcmpl-n3-001"],  # two calls' own ids that end in digits
    ],
)
def test_what_is_not_one_call_stays_apart(ids: list[str]) -> None:
    tid = f.new_id(32)
    post = _caller(tid)
    spans = [post] + [_prompt(tid, post, rid, start=i * 400.0) for i, rid in enumerate(ids)]
    assert sorted(r.request_id for r in summarize_trace(spans).requests) == sorted(ids)


def test_two_calls_with_one_id_under_two_callers_stay_two() -> None:
    tid = f.new_id(32)
    a, b = _caller(tid), _caller(tid)
    spans = [a, b, _prompt(tid, a, "cmpl-q-0"), _prompt(tid, b, "cmpl-q-1", start=1.0)]
    assert len(summarize_trace(spans).requests) == 2


def test_one_prompt_keeps_its_own_id() -> None:
    tid = f.new_id(32)
    post = _caller(tid)
    (r,) = summarize_trace([post, _prompt(tid, post, "chatcmpl-n2-001")]).requests
    assert r.request_id == "chatcmpl-n2-001"


def test_ttft_is_queue_plus_prefill_on_the_engine_clock() -> None:
    # vLLM's own TTFT is the front end's (first output there − arrival); its decode the
    # engine core's: 14 ms apart here, as on tests/data/engines' busy machine
    tid = f.new_id(32)
    (r,) = summarize_trace([_prompt(tid, None, "cmpl-t", front_end_ttft=40.0)]).requests
    assert r.ttft_ms == pytest.approx(26.0)
    assert r.ttft_ms == pytest.approx(r.queue_ms + r.prefill_ms)
    assert r.ttft_ms + r.decode_ms == pytest.approx(r.server_ms)
