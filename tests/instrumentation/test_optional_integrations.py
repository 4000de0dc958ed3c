"""openai and transformers integrations, against the real packages (both in the `dev` extra;
skipped only where someone installed the SDK without them)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import wrapt
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from tt_testkit import free_port

from tests.instrumentation._http_app import run_app
from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc


def test_openai_client_calls_get_client_spans(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    openai = pytest.importorskip("openai")
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions() -> dict[str, object]:
        return {
            "id": "c1",
            "object": "text_completion",
            "created": 0,
            "model": "tiny",
            "choices": [],
        }

    tt.instrument_openai()
    try:
        with run_app(tt.instrument_fastapi(app), free_port()) as url:
            with openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0) as client:
                client.completions.create(model="tiny", prompt="hi")
    finally:
        tt.uninstrument_openai()
    client_span = memory_sdk.spans(sc.SPAN_CLIENT)[0]
    server = memory_sdk.spans(sc.SPAN_REQUEST)[0]
    assert client_span.attributes[sc.REQUEST_MODEL] == "tiny"
    assert server.parent.span_id == client_span.context.span_id


CHUNKS = 5


def _chat_app() -> FastAPI:
    """A FastAPI app streaming an OpenAI chat completion: CHUNKS SSE events 20 ms apart."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        assert body["stream"] is True

        async def events() -> AsyncIterator[bytes]:
            for i in range(CHUNKS):
                await asyncio.sleep(0.02)
                chunk = {
                    "id": "c1", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "delta": {"content": f"t{i}"}, "finish_reason": None}],
                }  # fmt: skip
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return tt.instrument_fastapi(app)


def _assert_streamed_call(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """The client span measured the stream the user read, and is the server span's parent."""
    client_span = memory_sdk.spans(sc.SPAN_CLIENT)[0]
    server = memory_sdk.wait_for(sc.SPAN_REQUEST)[0]
    assert client_span.attributes[sc.REQUEST_MODEL] == "tiny"
    assert server.parent.span_id == client_span.context.span_id
    offsets = sc.unpack_list(client_span.attributes[sc.CLIENT_CHUNK_OFFSETS_US])
    # one network read per event, 20 ms apart (and the [DONE] event, read with the last or apart)
    assert CHUNKS <= len(offsets) <= CHUNKS + 1 and offsets == sorted(offsets)
    assert offsets[0] >= 15_000 and offsets[CHUNKS - 1] - offsets[0] >= 60_000
    assert client_span.attributes[sc.CLIENT_TTFC_S] == pytest.approx(offsets[0] / 1e6, abs=1e-6)
    # the client span ends when the user has read the stream, not when the headers came
    duration_us = (client_span.end_time - client_span.start_time) / 1000
    assert duration_us >= offsets[-1]


@pytest.mark.slow
def test_openai_streamed_chat_gets_chunk_times(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    openai = pytest.importorskip("openai")
    import httpx

    tt.instrument_openai()
    try:
        with run_app(_chat_app(), free_port()) as url:
            for http_client in (None, httpx.Client()):  # its own httpx client, or the user's
                memory_sdk.exporter.clear()
                kwargs = {} if http_client is None else {"http_client": http_client}
                # closed (with the user's httpx client): a pool left to the garbage
                # collector warns of its socket in whichever test collects it
                with openai.OpenAI(
                    base_url=f"{url}/v1", api_key="none", max_retries=0, **kwargs
                ) as client:
                    stream = client.chat.completions.create(
                        model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
                    )
                    text = "".join(c.choices[0].delta.content or "" for c in stream)
                assert text == "t0t1t2t3t4"
                _assert_streamed_call(memory_sdk)
    finally:
        tt.uninstrument_openai()


def test_async_openai_streamed_chat_gets_chunk_times(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    openai = pytest.importorskip("openai")

    async def call(url: str) -> str:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
        await client.close()
        return text

    tt.instrument_openai()
    try:
        with run_app(_chat_app(), free_port()) as url:
            assert asyncio.run(call(url)) == "t0t1t2t3t4"
    finally:
        tt.uninstrument_openai()
    _assert_streamed_call(memory_sdk)


@pytest.mark.slow
def test_instrument_httpx_covers_httpx2_clients(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """httpx2 (openai 3's HTTP client, httpx's API under its own name): every client traced."""
    httpx2 = pytest.importorskip("httpx2")
    body = {"model": "tiny", "messages": [], "stream": True}

    async def call(url: str) -> None:
        async with httpx2.AsyncClient() as client:
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
                assert [line async for line in resp.aiter_lines() if line][-1] == "data: [DONE]"

    tt.instrument_httpx()
    try:
        with run_app(_chat_app(), free_port()) as url:
            with httpx2.Client() as client:
                with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
                    assert len([line for line in resp.iter_lines() if line]) == CHUNKS + 1
            _assert_streamed_call(memory_sdk)
            memory_sdk.exporter.clear()
            asyncio.run(call(url))
            _assert_streamed_call(memory_sdk)
    finally:
        tt.uninstrument_httpx()
    assert not isinstance(httpx2.Client.__dict__["send"], wrapt.FunctionWrapper)


@pytest.mark.slow
def test_transformers_generate_records_token_times(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=64)
    model = transformers.GPT2LMHeadModel(config)
    tt.instrument_transformers_generate()
    try:
        with tt.request() as req:
            model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=5, min_new_tokens=5, do_sample=False,
                           pad_token_id=0)  # fmt: skip
    finally:
        tt.uninstrument_transformers_generate()
    assert req.token_count == 5
    assert memory_sdk.spans(sc.SPAN_PREFILL) and memory_sdk.spans(sc.SPAN_DECODE)
