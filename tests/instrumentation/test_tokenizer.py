"""wrap_tokenizer: a real HuggingFace `tokenizers.Tokenizer`, callables, sync and async."""

from __future__ import annotations

import asyncio

import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc

VOCAB = {"[UNK]": 0, "hello": 1, "world": 2, "slow": 3, "tokens": 4}


def _hf_tokenizer() -> Tokenizer:
    tok = Tokenizer(WordLevel(VOCAB, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    return tok


def _phase_spans(sdk, name: str) -> list:  # type: ignore[no-untyped-def]
    return sdk.spans(name)


def test_hf_tokenizer_calls_pass_through_and_are_timed(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    raw = _hf_tokenizer()
    tok = tt.wrap_tokenizer(raw)
    with tt.request() as req:
        enc = tok.encode("hello world tokens")
        text = tok.decode(enc.ids)
        batch = tok.encode_batch(["hello", "world"])
    assert enc.ids == raw.encode("hello world tokens").ids == [1, 2, 4]
    assert text == raw.decode([1, 2, 4])
    assert [b.ids for b in batch] == [[1], [2]]
    assert tok.get_vocab_size() == len(VOCAB)  # other methods untouched
    tokenize = _phase_spans(memory_sdk, sc.SPAN_TOKENIZE)
    detok = _phase_spans(memory_sdk, sc.SPAN_DETOKENIZE)
    assert len(tokenize) == 2 and len(detok) == 1
    req_span = memory_sdk.spans(sc.SPAN_REQUEST)[0]
    assert all(s.parent.span_id == req_span.context.span_id for s in tokenize + detok)
    assert req.request_id == req_span.attributes[sc.REQUEST_ID]


def test_outside_a_request_it_just_calls_through(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    tok = tt.wrap_tokenizer(_hf_tokenizer())
    assert tok.encode("hello").ids == [1]
    assert memory_sdk.spans() == []


def test_callable_tokenizer_and_explicit_request(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    def split(text: str) -> list[str]:
        return text.split()

    tok = tt.wrap_tokenizer(split)
    req = tt.request()  # not entered: the scheduler thread holds it, not a context
    explicit = tt.wrap_tokenizer(_hf_tokenizer(), request=req)
    assert tok("a b") == ["a", "b"]  # no current request: untimed
    assert explicit.encode("hello").ids == [1]
    req.finish()
    assert len(memory_sdk.spans(sc.SPAN_TOKENIZE)) == 1


def test_async_requests_keep_their_own_phases(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    tok = tt.wrap_tokenizer(_hf_tokenizer())

    async def handle(i: int) -> list[int]:
        with tt.request(request_id=f"r{i}"):
            await asyncio.sleep(0.001)
            ids: list[int] = tok.encode("hello world").ids
            await asyncio.sleep(0.001)
            tok.decode(ids)
            return ids

    async def main() -> list[list[int]]:
        return await asyncio.gather(*(handle(i) for i in range(3)))

    assert asyncio.run(main()) == [[1, 2]] * 3
    by_parent: dict[int, int] = {}
    for s in memory_sdk.spans(sc.SPAN_TOKENIZE) + memory_sdk.spans(sc.SPAN_DETOKENIZE):
        by_parent[s.parent.span_id] = by_parent.get(s.parent.span_id, 0) + 1
    assert sorted(by_parent.values()) == [2, 2, 2]


def test_user_exceptions_pass_through_unchanged(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    class Boom(Exception):
        pass

    def bad(text: str) -> list[int]:
        raise Boom(text)

    tok = tt.wrap_tokenizer(bad)
    with pytest.raises(Boom, match="oops"):
        with tt.request():
            tok("oops")
    assert len(memory_sdk.spans(sc.SPAN_TOKENIZE)) == 1


def test_refuses_things_that_are_not_tokenizers() -> None:
    with pytest.raises(TypeError, match="encode/decode"):
        tt.wrap_tokenizer(42)
