"""A wrapped tokenizer called inside an open `tokenize` phase is counted once.

README and docs/sdk.md §2 show `with req.phase("tokenize"): ids = tokenizer.encode(prompt)`
and §3 `tt.wrap_tokenizer(...)`: both together made two overlapping `tokentrace.tokenize`
spans (or a doubled `.total_us` once summarized), so the analyzer summed the tokenize time
twice and flagged `bucket_exceeds_e2e`.  The open phase already covers the call: the
wrapped tokenizer does not time it again.  Checked on what the exporter receives.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tokentrace import instrumentation as tt
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.collector.otlp import decode_protobuf
from tokentrace.instrumentation import semconv as sc

ENCODE_S = 0.05
DECODE_S = 0.005


class _SlowTokenizer:
    def encode(self, text: str) -> list[int]:
        time.sleep(ENCODE_S)
        return [len(w) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        time.sleep(DECODE_S)
        return "x" * len(ids)


class _AsyncTokenizer:
    async def encode(self, text: str) -> list[int]:
        await asyncio.sleep(ENCODE_S)
        return [1]


def _intervals(memory_sdk, name: str) -> list[float]:  # type: ignore[no-untyped-def]
    """The durations (s) of the exported spans named `name`."""
    return [(s.end_time - s.start_time) / 1e9 for s in memory_sdk.spans(name)]


def _serve(req: tt.RequestTrace) -> None:
    """The rest of a request: a prefill and two tokens (so the analyzer has a full one)."""
    req.start_phase("prefill")
    req.token()
    req.end_phase("prefill")
    req.start_phase("decode")
    req.token()
    req.end_phase("decode")


def test_readme_pattern_with_a_wrapped_tokenizer_is_one_tokenize(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    tok = tt.wrap_tokenizer(_SlowTokenizer())
    with tt.request(model="m") as req:
        with req.phase("tokenize"):
            ids = tok.encode("a prompt of six words here")
        _serve(req)
    assert ids == [1, 6, 2, 3, 5, 4]
    (interval,) = _intervals(memory_sdk, sc.SPAN_TOKENIZE)  # one span, not two overlapping
    assert interval >= ENCODE_S
    (r,) = summarize_trace(decode_protobuf(memory_sdk.otlp_bytes())).requests
    assert r.tokenize_ms == pytest.approx(interval * 1000, abs=0.01)  # counted once
    assert "bucket_exceeds_e2e" not in r.flags


def test_start_phase_pattern_and_the_decorator_are_one_tokenize(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    tok = tt.wrap_tokenizer(_SlowTokenizer())

    @tt.phase("tokenize")
    def tokenize(prompt: str) -> list[int]:
        return tok.encode(prompt)  # type: ignore[no-any-return]

    with tt.request() as manual:
        manual.start_phase("tokenize")
        tok.encode("hi there")
        manual.end_phase("tokenize")
        _serve(manual)
    with tt.request() as decorated:
        tokenize("hi there")
        _serve(decorated)
    spans = memory_sdk.spans(sc.SPAN_TOKENIZE)
    owners = sorted(s.parent.span_id for s in spans)
    request_ids = sorted(s.context.span_id for s in memory_sdk.spans(sc.SPAN_REQUEST))
    assert owners == request_ids  # one tokenize span each
    assert all((s.end_time - s.start_time) / 1e9 >= ENCODE_S for s in spans)


def test_tokenizer_in_a_thread_inside_the_phase_is_one_tokenize(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """The review's server: `with req.phase("tokenize"): await asyncio.to_thread(tok.encode, p)`
    (the thread runs in a copy of the context: the same request)."""
    tok = tt.wrap_tokenizer(_SlowTokenizer())

    async def handler() -> None:
        with tt.request() as req:
            with req.phase("tokenize"):
                await asyncio.to_thread(tok.encode, "hello world")
            _serve(req)

    asyncio.run(handler())
    (interval,) = _intervals(memory_sdk, sc.SPAN_TOKENIZE)
    assert interval >= ENCODE_S


def test_async_tokenizer_inside_the_phase_is_one_tokenize(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    tok = tt.wrap_tokenizer(_AsyncTokenizer())

    async def handler() -> None:
        with tt.request() as req:
            with req.phase("tokenize"):
                assert await tok.encode("hi") == [1]
            _serve(req)

    asyncio.run(handler())
    (interval,) = _intervals(memory_sdk, sc.SPAN_TOKENIZE)
    assert interval >= ENCODE_S


def test_a_phase_on_another_request_does_not_silence_this_one(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """Concurrent requests on one event loop: one inside its tokenize phase does not keep
    another's wrapped tokenizer from timing its own call."""
    tok = tt.wrap_tokenizer(_AsyncTokenizer())
    started = asyncio.Event()

    async def in_phase() -> None:
        with tt.request() as req:
            with req.phase("tokenize"):
                started.set()
                await asyncio.sleep(2 * ENCODE_S)
            _serve(req)

    async def wrapped_only() -> None:
        await started.wait()
        with tt.request() as req:
            await tok.encode("hi")
            _serve(req)

    async def main() -> None:
        await asyncio.gather(in_phase(), wrapped_only())

    asyncio.run(main())
    intervals = sorted(_intervals(memory_sdk, sc.SPAN_TOKENIZE))
    assert len(intervals) == 2
    assert intervals[0] >= ENCODE_S and intervals[1] >= 2 * ENCODE_S


def test_summarized_detokenize_inside_its_phase_counts_each_call_once(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """A streaming server detokenizing once per token inside its own phase: more than
    PHASE_SPANS_MAX calls are summed on the request span, each call once."""
    tok = tt.wrap_tokenizer(_SlowTokenizer())
    calls = 10
    with tt.request() as req:
        tok.encode("hi")  # no phase open: timed by the wrapper, as before
        for i in range(calls):
            with req.phase("detokenize"):
                tok.decode([i])
            with req.phase("tokenize"):
                tok.decode([i])  # a decode inside tokenize is still detokenize time
        _serve(req)
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert span.attributes[sc.DETOKENIZE_CALLS] == 2 * calls  # 10 phases + 10 wrapped decodes
    assert span.attributes[sc.TOKENIZE_CALLS] == calls + 1  # 10 phases + the bare encode
    # the detokenize total: 10 outer phases and the 10 decodes inside tokenize, no overlap
    assert span.attributes[sc.DETOKENIZE_TOTAL_US] >= 2 * calls * DECODE_S * 1e6
    # the tokenize total is the bare encode and the phases (each holding one decode)
    total_s = span.attributes[sc.TOKENIZE_TOTAL_US] / 1e6
    assert ENCODE_S + calls * DECODE_S <= total_s


def test_summarized_tokenize_phase_is_not_doubled(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """More than PHASE_SPANS_MAX `with req.phase("tokenize")` blocks around wrapped calls:
    the summed time is the phases' own, not twice it."""
    tok = tt.wrap_tokenizer(_SlowTokenizer())
    calls = 6
    with tt.request() as req:
        t0 = time.monotonic_ns()
        for _ in range(calls):
            with req.phase("tokenize"):
                tok.encode("hi")
        elapsed_us = (time.monotonic_ns() - t0) / 1000
        _serve(req)
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert span.attributes[sc.TOKENIZE_CALLS] == calls
    assert calls * ENCODE_S * 1e6 <= span.attributes[sc.TOKENIZE_TOTAL_US] <= elapsed_us
    (r,) = summarize_trace(decode_protobuf(memory_sdk.otlp_bytes())).requests
    assert r.tokenize_ms <= elapsed_us / 1000
    assert "bucket_exceeds_e2e" not in r.flags
