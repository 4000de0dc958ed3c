"""An exception that leaves the app after the answer's last byte: still the request's.

Starlette's `BaseHTTPMiddleware` (every `@app.middleware("http")`) sends a streamed
body's end and only then raises the exception that cut the stream: the client got a
truncated 200, the server logged a traceback, and the request read as a success.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest
from fastapi import BackgroundTasks, FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from opentelemetry.trace import StatusCode
from tt_testkit import free_port

from tests.instrumentation._http_app import run_app
from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _asgi
from tokentrace.instrumentation import semconv as sc

pytestmark = pytest.mark.slow


def _serve(app: FastAPI) -> AbstractContextManager[str]:
    return run_app(app, free_port(), log_level="critical")


def _app(with_base_middleware: bool) -> FastAPI:
    app = FastAPI()
    if with_base_middleware:

        @app.middleware("http")
        async def passthrough(
            request: Request, call_next: Callable[[Request], Awaitable[Response]]
        ) -> Response:
            return await call_next(request)

    @app.get("/cut")
    async def cut() -> StreamingResponse:
        req = tt.current_request()
        assert req is not None

        async def body() -> AsyncIterator[bytes]:
            for i in range(5):
                req.token()
                yield f"data: {i}\n\n".encode()
                await asyncio.sleep(0.01)
                if i == 2:
                    raise RuntimeError("engine died mid-stream")

        return StreamingResponse(body(), media_type="text/event-stream")

    return tt.instrument_fastapi(app)


def _get(url: str) -> None:
    try:
        httpx.get(url, timeout=30)
    except httpx.HTTPError:
        pass  # without a middleware in between, the connection is cut mid-body


def test_stream_cut_by_an_exception_is_an_error_behind_base_http_middleware(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    for with_base in (False, True):
        memory_sdk.exporter.clear()
        with _serve(_app(with_base)) as url:
            _get(url + "/cut")
            (span,) = memory_sdk.wait_for(sc.SPAN_REQUEST)
        assert span.status.status_code is StatusCode.ERROR, with_base
        assert [e.attributes["exception.type"] for e in span.events if e.name == "exception"] == [
            "RuntimeError"
        ]
        assert sc.REQUEST_DISCONNECTED not in span.attributes
        assert len(sc.unpack_list(span.attributes[sc.TOKEN_OFFSETS_US])) == 3


def test_long_background_task_ends_the_request_at_its_last_byte(memory_sdk, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The request ends at the answer's last byte and leaves within the late-error window,
    not after a background task that runs on; that task's later failure is its own."""
    monkeypatch.setattr(_asgi, "LATE_ERROR_WINDOW_S", 0.2)
    release = threading.Event()
    app = FastAPI()

    async def job() -> None:
        while not release.is_set():
            await asyncio.sleep(0.01)
        raise ValueError("the background job failed, long after the answer")

    @app.get("/bg")
    async def bg(tasks: BackgroundTasks) -> dict[str, Any]:
        tasks.add_task(job)
        return {"ok": True}

    tt.instrument_fastapi(app)
    with _serve(app) as url:
        try:
            before_ns = time.time_ns()
            assert httpx.get(url + "/bg", timeout=30).json() == {"ok": True}
            answered_ns = time.time_ns()
            # exported while the background task still runs
            (span,) = memory_sdk.wait_for(sc.SPAN_REQUEST)
        finally:
            release.set()
    assert before_ns <= span.end_time <= answered_ns
    assert span.status.status_code is StatusCode.UNSET
    assert span.attributes[sc.HTTP_STATUS] == 200
