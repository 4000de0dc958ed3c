"""`with tt.request()` inside a streaming body: a consumer leaving is no server error.

The decorators and the ASGI middleware mark a client that goes away
`tokentrace.request.disconnected` with the status unset; a request opened
with `with` inside the generator (docs §2, §8 "other frameworks") ends the
same way, through the same code (`RequestTrace._end`).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from opentelemetry.trace import StatusCode
from tt_testkit import free_port

from tests.instrumentation._http_app import run_app
from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _left_without_error(span: Any) -> None:
    assert span.attributes.get(sc.REQUEST_DISCONNECTED) is True
    assert span.status.status_code is StatusCode.UNSET
    assert not [e for e in span.events if e.name == "exception"]


def test_client_leaving_a_stream_that_holds_request_from_headers(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """A real server: Starlette cancels the stream when the client drops (CancelledError)."""
    app = FastAPI()
    seen: dict[str, str] = {}

    @app.get("/s")
    async def stream(request: Request) -> StreamingResponse:
        headers = request.headers

        async def body() -> AsyncIterator[str]:
            with tt.request_from_headers(headers, model="m") as req:
                try:
                    for i in range(200):
                        await asyncio.sleep(0.01)
                        req.token()
                        yield f"data: {i}\n\n"
                except BaseException as exc:
                    seen["exit"] = type(exc).__name__
                    raise

        return StreamingResponse(body(), media_type="text/event-stream")

    with run_app(app, free_port(), log_level="critical") as url:
        headers = {"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}
        with httpx.stream("GET", url + "/s", headers=headers) as resp:
            lines = resp.iter_lines()
            assert next(lines) == "data: 0"
        (span,) = memory_sdk.wait_for(sc.SPAN_REQUEST)
    assert seen["exit"] in ("CancelledError", "GeneratorExit")  # it did go away mid-stream
    _left_without_error(span)
    assert f"{span.context.trace_id:032x}" == TRACE


@pytest.mark.slow
def test_with_request_in_generators_closed_or_cancelled(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    def sync_body() -> Iterator[int]:
        with tt.request(request_id="sync") as req:
            for i in range(100):
                req.token()
                yield i

    async def async_body() -> AsyncIterator[int]:
        async with tt.request(request_id="async") as req:
            for i in range(100):
                await asyncio.sleep(0)
                req.token()
                yield i

    async def handler() -> None:
        with tt.request(request_id="cancelled"):
            await asyncio.sleep(10)

    gen = sync_body()
    next(gen)
    gen.close()  # GeneratorExit

    async def main() -> None:
        agen = async_body()
        await agen.__anext__()
        await agen.aclose()
        task = asyncio.create_task(handler())
        await asyncio.sleep(0.01)
        task.cancel()  # a client disconnect cancels the handler's task
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    gc.collect()
    spans = {s.attributes[sc.REQUEST_ID]: s for s in memory_sdk.spans(sc.SPAN_REQUEST)}
    assert sorted(spans) == ["async", "cancelled", "sync"]
    for span in spans.values():
        _left_without_error(span)


def test_with_request_in_a_generator_that_fails_is_an_error(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    def body() -> Iterator[int]:
        with tt.request():
            yield 1
            raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        list(body())
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert span.status.status_code is StatusCode.ERROR
    assert sc.REQUEST_DISCONNECTED not in span.attributes
