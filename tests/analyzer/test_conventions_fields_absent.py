"""Unknown is not zero: each adapter, given a request without its optional fields,
reports what it does not know as None, never as 0 (docs/conventions.md)."""

from __future__ import annotations

import pytest

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.instrumentation import semconv as sc

from . import spanfactory as f

#: optional fields per convention, as each engine names them
OPTIONAL = {
    "vllm": ("gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens",
             "gen_ai.latency.time_to_first_token", "gen_ai.latency.time_in_model_decode",
             "gen_ai.latency.time_in_model_inference"),
    "sglang": ("gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens",
               "gen_ai.latency.time_to_first_token"),
    "tgi": ("total_time", "validation_time", "queue_time", "inference_time", "time_per_token"),
    "genai_client": ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"),
    "tokentrace": (sc.PROMPT_TOKENS, sc.OUTPUT_TOKENS, sc.TOKEN_OFFSETS_US),
}


def _without(spans: list[Span], keys: tuple[str, ...]) -> list[Span]:
    for x in spans:
        for key in keys:
            x.attributes.pop(key, None)
    return spans


def _one(spans: list[Span], source: str) -> RequestSummary:
    (r,) = [r for r in summarize_trace(_without(spans, OPTIONAL[source])).requests if r.source == source]
    return r


def test_vllm() -> None:
    spans, _ = f.vllm_trace(10.0, 50.0, 200.0)
    r = _one(spans, "vllm")
    assert (r.prompt_tokens, r.output_tokens, r.tpot_ms, r.ttft_ms) == (None, None, None, None)
    assert r.decode_ms == 0.0 and r.server_ms == pytest.approx(260.0)  # decode not measured
    assert r.gpu_util_mean is None and r.gpu_mem_max_bytes is None


def test_sglang() -> None:
    spans, _ = f.sglang_trace(2.0, 10.0, 40.0, 150.0, tokens=16)
    r = _one(spans, "sglang")
    assert (r.prompt_tokens, r.output_tokens, r.tpot_ms) == (None, None, None)
    # the end of prefill stands in for TTFT: the request did not say it made no token
    assert r.ttft_ms is not None and r.prefill_ms == pytest.approx(40.0)


def test_tgi() -> None:
    # an answer that did not end well: TGI records its timing fields only at the end
    spans, _ = f.tgi_trace(2.0, 30.0, 60.0, 10.0, 8)
    r = _one(spans, "tgi")
    assert r.prompt_tokens is None
    assert r.output_tokens == 8  # its infer steps were counted: known, not a default
    assert r.ttft_ms == pytest.approx(2.0 + 30.0 + 60.0)


def test_tgi_refused_knows_no_token_count() -> None:
    spans, _ = f.tgi_trace(2.0, 30.0, 60.0, 10.0, 8, attrs_only=True)
    r = _one(spans, "tgi")
    assert (r.output_tokens, r.tpot_ms, r.ttft_ms) == (None, None, None)


@pytest.mark.parametrize("style", ["openllmetry", "openinference", "ttfc"])
def test_genai_client(style: str) -> None:
    spans, _ = f.genai_client_trace(80.0, 10.0, 6, style=style)
    for x in spans:
        for key in ("llm.token_count.prompt", "llm.token_count.completion"):
            x.attributes.pop(key, None)
    r = _one(spans, "genai_client")
    assert r.prompt_tokens is None
    # the chunk events are a count of what was streamed; nothing else is
    assert r.output_tokens == (6 if style == "openllmetry" else None)


def test_tokentrace_sdk() -> None:
    spans, _ = f.sdk_trace(1.0, 5.0, 30.0, 10.0, 5)
    r = _one(spans, "tokentrace")
    assert (r.prompt_tokens, r.output_tokens, r.tpot_ms) == (None, None, None)
    assert r.itl_p50_ms is None and r.stall_count is None
