"""A small streaming FastAPI app instrumented with the SDK, served by uvicorn in a thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse

from tokentrace import instrumentation as tt

TOKENS = 5
ITL_S = 0.01


class CompletionCounter:
    """Outermost ASGI middleware: counts requests whose inner app (span included) has finished."""

    done = threading.Semaphore(0)

    def __init__(self, app: object) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
        try:
            await self.app(scope, receive, send)  # type: ignore[operator]
        finally:
            if scope["type"] == "http":
                CompletionCounter.done.release()


def wait_completed(count: int = 1, timeout_s: float = 10.0) -> None:
    """Waits until `count` more requests finished on the server (their spans have ended)."""
    for _ in range(count):
        assert CompletionCounter.done.acquire(timeout=timeout_s)


def make_app() -> FastAPI:
    app = FastAPI()

    @app.get("/v1/stream/{name}")
    async def stream(name: str) -> StreamingResponse:
        req = tt.current_request()
        assert req is not None  # the middleware made one

        async def body() -> AsyncIterator[bytes]:
            req.start_phase("prefill")
            await asyncio.sleep(0.02)
            for i in range(TOKENS):
                if i == 1:
                    req.start_phase("decode")
                if i:
                    await asyncio.sleep(ITL_S)
                req.token()
                if i == 0:
                    req.end_phase("prefill")
                yield f"data: tok{i}\n\n".encode()
            req.end_phase("decode")
            req.set_tokens(prompt=3)

        return StreamingResponse(body(), media_type="text/event-stream")

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("handler failed")

    return app


@contextmanager
def run_app(app: FastAPI, port: int, **config: Any) -> Iterator[str]:
    """Serves `app` on 127.0.0.1:`port` in a thread; gives its base URL.  `config`: more
    uvicorn settings (`root_path`, `log_level`)."""
    settings: dict[str, Any] = {"log_level": "warning", **config}
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", **settings)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    # a loaded machine may take seconds to start uvicorn's thread; and a server that did not
    # start is said here, not as a refused connection later
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the test app did not start on 127.0.0.1:{port}")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
