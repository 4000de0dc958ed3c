"""A streaming server's tokenizer calls: one `decode` per token is summarized, not a span each."""

from __future__ import annotations

import time

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from tokentrace import instrumentation as tt
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.collector.otlp import decode_protobuf
from tokentrace.instrumentation import semconv as sc
from tokentrace.instrumentation._request import PHASE_SPANS_MAX

VOCAB = {"[UNK]": 0, "hello": 1, "world": 2, "slow": 3, "tokens": 4}
SUMMARY_KEYS = (
    sc.TOKENIZE_CALLS,
    sc.TOKENIZE_TOTAL_US,
    sc.DETOKENIZE_CALLS,
    sc.DETOKENIZE_TOTAL_US,
)


def _tokenizer() -> Tokenizer:
    tok = Tokenizer(WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    return tok


def _children(sdk, parent) -> list:  # type: ignore[no-untyped-def]
    return [s for s in sdk.spans() if s.parent and s.parent.span_id == parent.context.span_id]


def test_decode_per_token_is_summarized_on_the_request_span(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    tok = tt.wrap_tokenizer(_tokenizer())
    with tt.request():
        ids = tok.encode("hello world tokens").ids
        for i in range(300):  # incremental detokenization: one decode per generated token
            tt.current_request().token()  # type: ignore[union-attr]
            tok.decode([ids[i % 3]])
    (req,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert memory_sdk.spans(sc.SPAN_DETOKENIZE) == []  # no span per call
    assert [s.name for s in _children(memory_sdk, req)] == [sc.SPAN_TOKENIZE]  # the one encode
    attrs = req.attributes
    assert attrs[sc.DETOKENIZE_CALLS] == 300
    total_us = attrs[sc.DETOKENIZE_TOTAL_US]
    assert isinstance(total_us, int) and 0 < total_us * 1000 <= req.end_time - req.start_time
    assert sc.TOKENIZE_CALLS not in attrs and sc.TOKENIZE_TOTAL_US not in attrs
    assert attrs[sc.OUTPUT_TOKENS] == 300


def test_one_encode_and_one_decode_stay_two_spans(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    tok = tt.wrap_tokenizer(_tokenizer())
    with tt.request():
        tok.decode(tok.encode("hello world").ids)
    (req,) = memory_sdk.spans(sc.SPAN_REQUEST)
    children = _children(memory_sdk, req)
    assert sorted(s.name for s in children) == [sc.SPAN_DETOKENIZE, sc.SPAN_TOKENIZE]
    assert not set(SUMMARY_KEYS) & set(req.attributes)


@pytest.mark.parametrize("calls", [PHASE_SPANS_MAX, PHASE_SPANS_MAX + 1])
def test_the_limit_is_spans_and_one_more_is_a_summary(memory_sdk, calls: int) -> None:  # type: ignore[no-untyped-def]
    tok = tt.wrap_tokenizer(_tokenizer())
    with tt.request():
        for _ in range(calls):
            tok.decode([1, 2])
        tok.encode("hello")  # another phase keeps its span either way
    (req,) = memory_sdk.spans(sc.SPAN_REQUEST)
    detok = memory_sdk.spans(sc.SPAN_DETOKENIZE)
    assert len(memory_sdk.spans(sc.SPAN_TOKENIZE)) == 1
    if calls <= PHASE_SPANS_MAX:
        assert len(detok) == calls
        assert sc.DETOKENIZE_CALLS not in req.attributes
    else:
        assert detok == []
        assert req.attributes[sc.DETOKENIZE_CALLS] == calls
        assert req.attributes[sc.DETOKENIZE_TOTAL_US] > 0


def test_a_phase_of_the_hosts_own_is_summarized_too(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    with tt.request() as req:
        for _ in range(10):
            with req.phase("postprocess"):
                pass
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert memory_sdk.spans("tokentrace.postprocess") == []
    assert span.attributes["tokentrace.postprocess" + sc.PHASE_CALLS_SUFFIX] == 10
    assert span.attributes["tokentrace.postprocess" + sc.PHASE_TOTAL_US_SUFFIX] >= 0


def test_many_tokenize_calls_still_count_in_the_queue_bucket(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """The analyzer reads tokenization (part of the queue bucket) from the summary too."""

    def slow_encode(text: str) -> list[str]:  # a callable tokenizer: 1 ms a call
        time.sleep(0.001)
        return text.split()

    tok = tt.wrap_tokenizer(slow_encode)
    calls = PHASE_SPANS_MAX + 6
    with tt.request(model="m") as req:
        for _ in range(calls):  # e.g. counting each streamed chunk's tokens
            tok("hello world")
        req.start_phase("prefill")
        req.token()
        req.end_phase("prefill")
        req.start_phase("decode")
        req.token()
        req.end_phase("decode")
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert memory_sdk.spans(sc.SPAN_TOKENIZE) == []
    assert span.attributes[sc.TOKENIZE_CALLS] == calls
    total_us = span.attributes[sc.TOKENIZE_TOTAL_US]
    assert total_us >= calls * 1000
    (r,) = summarize_trace(decode_protobuf(memory_sdk.otlp_bytes())).requests
    assert r.tokenize_ms == pytest.approx(total_us / 1000, abs=0.001)
    assert r.tokenize_ms <= r.queue_ms


def test_the_schedulers_stages_stay_spans_however_many(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """A chunked prefill marks prefill per chunk: the analyzer reads its first span's start."""
    chunks = PHASE_SPANS_MAX + 2
    with tt.request() as req:
        for _ in range(chunks):
            req.start_phase("queue")
            req.end_phase("queue")
            req.start_phase("prefill")
            time.sleep(0.001)
            req.end_phase("prefill")
        req.token()
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert len(memory_sdk.spans(sc.SPAN_PREFILL)) == chunks
    assert len(memory_sdk.spans(sc.SPAN_QUEUE)) == chunks
    assert not [k for k in span.attributes if k.endswith(sc.PHASE_CALLS_SUFFIX)]
    (r,) = summarize_trace(decode_protobuf(memory_sdk.otlp_bytes())).requests
    assert r.prefill_ms >= chunks * 1.0  # from the first chunk's start to the first token
