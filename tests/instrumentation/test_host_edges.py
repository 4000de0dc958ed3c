"""Edges where the SDK met the host badly: a stream's consumer leaving read as a server
error, background tasks stretching the request span, `uninstrument_*` taking off another
library's wrapper, async tokenizers, an abandoned client span's context, and the status an
exception handler sends.  Servers are real (uvicorn on 127.0.0.1) where the host's
behaviour depends on it."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest
import wrapt
from fastapi import BackgroundTasks, FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from opentelemetry.trace import StatusCode
from tt_testkit import free_port

from tests.instrumentation._http_app import run_app
from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc
from tokentrace.instrumentation._tokenizer import TokenizerProxy


def _serve(app: FastAPI) -> AbstractContextManager[str]:
    return run_app(app, free_port(), log_level="critical")


def _left_without_error(span: Any) -> None:
    """The consumer left: marked, status unset, no exception recorded."""
    assert span.attributes.get(sc.REQUEST_DISCONNECTED) is True
    assert span.status.status_code is StatusCode.UNSET
    assert not [e for e in span.events if e.name == "exception"]


# ---------------------------------------------------------------- 1. streams' consumers leaving


def test_traced_request_stream_client_disconnect_is_not_an_error(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """docs §2: a StreamingResponse of a @traced_request async generator; the client
    drops after 4 lines (Starlette cancels the stream: CancelledError in the body)."""
    app = FastAPI()
    seen: dict[str, str] = {}

    @tt.traced_request(model="llama-8b")
    async def stream(prompt: str) -> AsyncIterator[str]:
        req = tt.current_request()
        assert req is not None
        try:
            for i in range(200):
                await asyncio.sleep(0.01)
                req.token()
                yield f"data: {i}\n\n"
        except BaseException as exc:
            seen["exit"] = type(exc).__name__
            raise

    @app.get("/gen")
    async def gen() -> StreamingResponse:
        return StreamingResponse(stream("p"), media_type="text/event-stream")

    with _serve(app) as url:
        with httpx.stream("GET", url + "/gen") as resp:
            lines = resp.iter_lines()
            got = [next(lines) for _ in range(4)]
        assert got[0] == "data: 0"
        (span,) = memory_sdk.wait_for(sc.SPAN_REQUEST)
    assert seen["exit"] in ("CancelledError", "GeneratorExit")  # it did go away mid-stream
    _left_without_error(span)
    assert span.attributes[sc.REQUEST_MODEL] == "llama-8b"


@pytest.mark.slow
def test_traced_request_generators_closed_early_are_not_errors(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    @tt.traced_request(model="m")
    async def astream() -> AsyncIterator[int]:
        for i in range(100):
            tt.current_request().token()  # type: ignore[union-attr]
            yield i

    @tt.traced_request(model="m")
    def sstream() -> Iterator[int]:
        for i in range(100):
            tt.current_request().token()  # type: ignore[union-attr]
            yield i

    async def main() -> None:
        agen = astream()
        await agen.__anext__()
        await agen.aclose()  # the client went away
        async for x in astream():  # the consumer stops early; asyncio's finalizer closes it
            if x == 3:
                break
        gc.collect()
        await asyncio.sleep(0.05)

    asyncio.run(main())
    gen = sstream()
    next(gen)
    next(gen)
    gen.close()
    spans = memory_sdk.spans(sc.SPAN_REQUEST)
    assert len(spans) == 3
    for span in spans:
        _left_without_error(span)


def test_traced_request_stream_failure_is_still_an_error(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    @tt.traced_request(model="m")
    def sstream() -> Iterator[int]:
        yield 1
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        list(sstream())
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert (
        span.status.status_code is StatusCode.ERROR
        and sc.REQUEST_DISCONNECTED not in span.attributes
    )


def test_middleware_marks_a_client_disconnect(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    app = FastAPI()

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            for _ in range(200):
                await asyncio.sleep(0.01)
                yield b"data: x\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    tt.instrument_fastapi(app)
    with _serve(app) as url:
        with httpx.stream("GET", url + "/stream") as resp:
            next(resp.iter_bytes())
        (span,) = memory_sdk.wait_for(sc.SPAN_REQUEST)
    _left_without_error(span)
    assert span.attributes[sc.HTTP_STATUS] == 200


# ---------------------------------------------------------------- 2. background tasks


@pytest.mark.slow
def test_background_task_does_not_stretch_the_request_span(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    app = FastAPI()
    release = threading.Event()

    async def held() -> None:  # a background task that ends only once the client has its answer
        while not release.is_set():
            await asyncio.sleep(0.01)

    @app.get("/bg")
    async def bg(background_tasks: BackgroundTasks) -> dict[str, int]:
        background_tasks.add_task(held)
        return {"x": 1}

    tt.instrument_fastapi(app)
    with _serve(app) as url:
        try:
            start = time.monotonic()
            # the client has its answer while the background task still runs (no wall time
            # asserted: a loaded machine's GET alone took more than the 1 s once allowed)
            assert httpx.get(url + "/bg", timeout=60).json() == {"x": 1}
            client_s = time.monotonic() - start
            # the span ends as the answer leaves (a hair after the client may have read
            # it); the background task is released well after that
            time.sleep(1.0)
            released_ns = time.time_ns()
        finally:
            release.set()
        (span,) = memory_sdk.wait_for(sc.SPAN_REQUEST)
    server_s = (span.end_time - span.start_time) / 1e9
    # a span stretched to the end of the background task would end after its release
    assert span.end_time < released_ns
    assert server_s <= client_s  # the server's time is within the client's: network >= 0
    assert span.attributes[sc.HTTP_STATUS] == 200 and span.status.status_code is StatusCode.UNSET


# ---------------------------------------------------------------- 6b. exception handlers


def test_exception_handler_status_is_the_one_sent(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    app = FastAPI()

    @app.exception_handler(Exception)
    async def overloaded(request: Any, exc: Exception) -> JSONResponse:
        return JSONResponse({"err": "overloaded"}, status_code=503)

    @app.get("/x")
    async def x() -> None:
        raise RuntimeError("boom")

    tt.instrument_fastapi(app)

    async def main() -> int:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return (await client.get("/x")).status_code

    assert asyncio.run(main()) == 503
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert span.attributes[sc.HTTP_STATUS] == 503
    assert span.status.status_code is StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in span.events if e.name == "exception"] == [
        "RuntimeError"
    ]  # the exception itself, once


def test_uninstrument_fastapi_restores_the_stack(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    app = FastAPI()

    @app.get("/ok")
    async def ok() -> dict[str, bool]:
        return {"traced": tt.current_request() is not None}

    tt.instrument_fastapi(app)
    tt.uninstrument_fastapi(app)
    assert "build_middleware_stack" not in vars(app)

    async def main() -> Any:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as client:
            return (await client.get("/ok")).json()

    assert asyncio.run(main()) == {"traced": False}
    assert not memory_sdk.spans(sc.SPAN_REQUEST)


# ---------------------------------------------------------------- 3. uninstrument and other wrappers


def _theirs(calls: list[str]) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        calls.append("theirs")
        return wrapped(*args, **kwargs)

    return wrapper


def test_uninstrument_httpx_leaves_a_wrapper_layered_above_ours(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    originals = {cls: cls.__dict__["send"] for cls in (httpx.Client, httpx.AsyncClient)}
    calls: list[str] = []
    try:
        tt.instrument_httpx()
        wrapt.wrap_function_wrapper(httpx.Client, "send", _theirs(calls))  # another library's
        tt.uninstrument_httpx()
        client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200)))
        client.get("http://x/")
        assert calls == ["theirs"]  # theirs still on
        assert not memory_sdk.spans(sc.SPAN_CLIENT)  # ours off
        assert httpx.Client.__dict__["send"].__wrapped__ is originals[httpx.Client]
    finally:
        tt.uninstrument_httpx()
        for cls, send in originals.items():
            setattr(cls, "send", send)  # noqa: B010


def test_uninstrument_httpx_client_leaves_a_wrapper_layered_above_ours(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    calls: list[str] = []
    client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    tt.instrument_httpx(client)
    client.send = wrapt.FunctionWrapper(client.send, _theirs(calls))  # type: ignore[method-assign]
    tt.instrument_httpx(client)  # still instrumented: no second layer of ours
    client.get("http://x/")
    assert len(memory_sdk.spans(sc.SPAN_CLIENT)) == 1
    tt.uninstrument_httpx(client)
    memory_sdk.exporter.clear()
    client.get("http://x/")
    assert calls == ["theirs", "theirs"] and not memory_sdk.spans(sc.SPAN_CLIENT)


def test_uninstrument_openai_leaves_a_wrapper_layered_above_ours(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    openai = pytest.importorskip("openai")
    originals = {name: getattr(openai, name).__dict__["__init__"] for name in ("OpenAI",)}
    calls: list[str] = []
    try:
        tt.instrument_openai()
        wrapt.wrap_function_wrapper(openai.OpenAI, "__init__", _theirs(calls))
        tt.uninstrument_openai()
        client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="none")
        assert calls == ["theirs"]
        assert not isinstance(vars(client._client).get("send"), wrapt.FunctionWrapper)  # not ours
    finally:
        tt.uninstrument_openai()
        for name, init in originals.items():
            setattr(getattr(openai, name), "__init__", init)  # noqa: B010


@pytest.mark.slow
def test_uninstrument_transformers_leaves_a_wrapper_layered_above_ours() -> None:
    pytest.importorskip("transformers")
    from transformers.generation.utils import GenerationMixin

    from tokentrace.instrumentation._transformers import _generate

    original = GenerationMixin.__dict__["generate"]
    calls: list[str] = []
    try:
        tt.instrument_transformers_generate()
        wrapt.wrap_function_wrapper(GenerationMixin, "generate", _theirs(calls))
        tt.uninstrument_transformers_generate()
        current = GenerationMixin.__dict__["generate"]
        assert isinstance(current, wrapt.FunctionWrapper)  # theirs still on
        assert current._self_wrapper is not _generate and current.__wrapped__ is original
    finally:
        tt.uninstrument_transformers_generate()
        setattr(GenerationMixin, "generate", original)  # noqa: B010


# ---------------------------------------------------------------- 4. tokenizers


class _AsyncTokenizer:
    async def encode(self, text: str) -> list[int]:
        await asyncio.sleep(0.2)
        return [1]

    async def decode(self, ids: list[int]) -> str:
        await asyncio.sleep(0.1)
        return "x"


def test_async_tokenizer_is_timed_until_it_completes(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    tok = tt.wrap_tokenizer(_AsyncTokenizer())

    async def main() -> str:
        with tt.request(model="m"):
            return await tok.decode(await tok.encode("hi"))  # type: ignore[no-any-return]

    assert asyncio.run(main()) == "x"
    durations = {s.name: (s.end_time - s.start_time) / 1e9 for s in memory_sdk.spans() if s.parent}
    assert durations[sc.SPAN_TOKENIZE] >= 0.19
    assert durations[sc.SPAN_DETOKENIZE] >= 0.09


def test_tokenizer_proxy_has_what_the_tokenizer_has() -> None:
    class CallOnly:
        def __call__(self, text: str) -> list[int]:
            return [1, 2]

    class EncodeOnly:
        def encode(self, text: str) -> list[int]:
            return [1]

    call_only = tt.wrap_tokenizer(CallOnly())
    assert callable(call_only) and call_only("a") == [1, 2]
    assert not hasattr(call_only, "decode") and not hasattr(call_only, "encode")
    encode_only = tt.wrap_tokenizer(EncodeOnly())
    assert not callable(encode_only) and not hasattr(encode_only, "decode")
    assert encode_only.encode("a") == [1]
    assert isinstance(encode_only, TokenizerProxy) and isinstance(encode_only, EncodeOnly)


# ---------------------------------------------------------------- 5. abandoned client spans


@pytest.mark.slow
def test_abandoned_client_request_generator_logs_no_detach_error(memory_sdk, caplog) -> None:  # type: ignore[no-untyped-def]
    async def relay() -> AsyncIterator[int]:
        async with tt.client_request(model="m") as cr:
            for i in range(10):
                cr.chunk()
                yield i
                await asyncio.sleep(0)

    async def main() -> None:
        for _ in range(5):
            agen = relay()
            async for x in agen:
                if x == 2:
                    break  # abandoned: asyncio's finalizer closes it in a task of its own
            del agen
            gc.collect()
            await asyncio.sleep(0.01)

    with caplog.at_level(logging.DEBUG):
        asyncio.run(main())
    assert not [r for r in caplog.records if "detach" in r.getMessage().lower()]
    assert len(memory_sdk.spans(sc.SPAN_CLIENT)) == 5
