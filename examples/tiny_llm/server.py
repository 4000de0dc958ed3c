"""OpenAI-compatible HTTP front end for the tiny LLM: POST /v1/completions, GET /health.

Run: python -m tokentrace.examples.tiny_llm.server --port 8000
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

from .config import ServerConfig
from .engine import TinyLLMEngine
from .scheduler import TRAFFIC_CLASS_PRIORITY, TokenEvent
from .tracing import RequestTracing, setup_tracing, shutdown_tracing

logger = logging.getLogger(__name__)

TENANT_HEADER = "x-tenant"
TRAFFIC_CLASS_HEADER = "x-traffic-class"
REQUEST_ID_HEADER = "x-request-id"


class StreamOptions(BaseModel):
    include_usage: bool = False


class CompletionRequest(BaseModel):
    """The subset of OpenAI's completion request the tiny model honours."""

    model: str | None = None
    prompt: str | list[str]
    max_tokens: int = Field(default=16, ge=1)
    stream: bool = False
    temperature: float = Field(default=0.0, ge=0.0)
    seed: int | None = None
    user: str | None = None
    stream_options: StreamOptions | None = None


class CompletionError(Exception):
    """A request the server refuses; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class RequestContext:
    """Who sent the request and how to serve it, read from the headers."""

    request_id: str
    tenant: str | None  # None: the request named none (not recorded as a tenant)
    traffic_class: str
    received_at: float  # perf_counter() when the handler started


def error_status(exc: Exception) -> int:
    """Return the HTTP status for an exception raised while serving a completion."""
    if isinstance(exc, CompletionError):
        return exc.status
    if isinstance(exc, ValueError):
        return 400
    if isinstance(exc, RuntimeError):
        return 503
    return 500


def _error_body(message: str, status: int) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "code": status}}


class CompletionHandler:
    """Serves one completion: tokenize → generate (queue, prefill, decode) → detokenize → respond."""

    def __init__(self, engine: TinyLLMEngine, traced: bool = False) -> None:
        self.engine = engine
        self.traced = traced  # tokentrace configured: every request gets a RequestTracing

    def context(self, request: Request, body: CompletionRequest) -> RequestContext:
        traffic_class = request.headers.get(TRAFFIC_CLASS_HEADER, "interactive").strip().lower()
        if traffic_class not in TRAFFIC_CLASS_PRIORITY:
            raise CompletionError(
                f"{TRAFFIC_CLASS_HEADER} must be one of {sorted(TRAFFIC_CLASS_PRIORITY)}, got {traffic_class!r}"
            )
        return RequestContext(
            request_id=request.headers.get(REQUEST_ID_HEADER) or f"cmpl-{uuid.uuid4().hex}",
            tenant=request.headers.get(TENANT_HEADER) or body.user or None,
            traffic_class=traffic_class,
            received_at=time.perf_counter(),
        )

    def tokenize(self, body: CompletionRequest, tokenizer: Any = None) -> list[int]:
        """Return the prompt's token ids (a list prompt must hold exactly one string)."""
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise CompletionError("only one prompt per request is supported")
            prompt = prompt[0]
        prompt_ids = (tokenizer or self.engine.tokenizer).encode(prompt)
        if not prompt_ids:
            raise CompletionError("prompt must not be empty")
        return list(prompt_ids)

    async def handle(self, request: Request, body: CompletionRequest) -> Any:
        """Return a streaming (SSE) or a JSON completion response."""
        ctx = self.context(request, body)
        model = body.model or self.engine.config.model_name
        traced = (
            RequestTracing(
                self.engine,
                request.headers,
                request_id=ctx.request_id,
                model=model,
                tenant=ctx.tenant,
                traffic_class=ctx.traffic_class,
            )
            if self.traced
            else None
        )
        try:
            prompt_ids = self.tokenize(body, traced.tokenizer if traced else None)
            max_tokens = self.engine.max_tokens_for(len(prompt_ids), body.max_tokens)
            if traced is not None:
                traced.submitted()
            events = self.engine.generate(
                prompt_ids,
                max_tokens=max_tokens,
                request_id=ctx.request_id,
                traffic_class=ctx.traffic_class,
                tenant=ctx.tenant or "default",  # the scheduler's own bookkeeping
                temperature=body.temperature,
                seed=body.seed,
                on_admitted=traced.admitted if traced else None,
                on_token=traced.on_token if traced else None,
            )
        except Exception as exc:  # refused before any response: the span ends with the error
            if traced is not None:
                traced.finish(None, 0, exc)
            raise
        if body.stream:
            # Per-token detokenization takes microseconds: a phase span per token would
            # cost more to export than it measures, so streams detokenize untraced.
            detokenizer = self.engine.detokenizer()
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                self.stream(
                    ctx, model, len(prompt_ids), events, include_usage, detokenizer, traced
                ),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", REQUEST_ID_HEADER: ctx.request_id},
            )
        detokenizer = self.engine.detokenizer(traced.tokenizer if traced else None)
        try:
            result = await self.collect(ctx, model, len(prompt_ids), events, detokenizer)
        except Exception as exc:
            if traced is not None:
                traced.finish(len(prompt_ids), 0, exc)
            raise
        if traced is not None:
            traced.finish(len(prompt_ids), result["usage"]["completion_tokens"])
        return JSONResponse(result)

    async def stream(
        self,
        ctx: RequestContext,
        model: str,
        prompt_tokens: int,
        events: AsyncGenerator[TokenEvent, None],
        include_usage: bool,
        detokenizer: Any = None,
        traced: RequestTracing | None = None,
    ) -> AsyncIterator[str]:
        """Yield SSE lines: one completion chunk per token, then `data: [DONE]`."""
        created = int(time.time())
        detokenizer = detokenizer or self.engine.detokenizer()
        completion_tokens = 0
        error: BaseException | None = None
        try:
            async for event in events:
                text = ""
                if event.token_id is not None:
                    completion_tokens += 1
                    text = self.emit_text(detokenizer, event.token_id)
                if event.error:
                    error = RuntimeError(event.error)
                    yield _sse(_error_body(event.error, 500))
                    break
                yield _sse(_chunk(ctx.request_id, created, model, text, event.finish_reason))
            if include_usage:
                usage = _usage(prompt_tokens, completion_tokens)
                yield _sse(
                    {
                        **_chunk(ctx.request_id, created, model, None, None),
                        "choices": [],
                        "usage": usage,
                    }
                )
            yield "data: [DONE]\n\n"
        except BaseException as exc:  # client gone (cancelled) or a failure mid-stream
            error = exc
            raise
        finally:
            # Closing `events` cancels the request in the scheduler if it is still running.
            await events.aclose()
            if traced is not None:
                traced.finish(prompt_tokens, completion_tokens, error)

    def emit_text(self, detokenizer: Any, token_id: int) -> str:
        """Return the text for one output token (the per-token detokenize point)."""
        return str(detokenizer.push(token_id))

    async def collect(
        self,
        ctx: RequestContext,
        model: str,
        prompt_tokens: int,
        events: AsyncGenerator[TokenEvent, None],
        detokenizer: Any = None,
    ) -> dict[str, Any]:
        """Return the whole non-streaming completion body."""
        token_ids: list[int] = []
        finish_reason: str | None = None
        try:
            async for event in events:
                if event.error:
                    raise CompletionError(event.error, 500)
                if event.token_id is not None:
                    token_ids.append(event.token_id)
                finish_reason = event.finish_reason or finish_reason
        finally:
            await events.aclose()
        return {
            "id": ctx.request_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "text": detokenizer.text(token_ids)
                    if detokenizer is not None
                    else self.engine.detokenize(token_ids),
                    "index": 0,
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
            ],
            "usage": _usage(prompt_tokens, len(token_ids)),
        }


def _chunk(
    request_id: str, created: int, model: str, text: str | None, finish: str | None
) -> dict[str, Any]:
    choices = (
        []
        if text is None
        else [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]
    )
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def create_app(config: ServerConfig | None = None, engine: TinyLLMEngine | None = None) -> FastAPI:
    """Return the FastAPI app; the engine (model + scheduler thread) lives for the app's lifespan."""
    engine = engine or TinyLLMEngine(config or ServerConfig.from_env())
    traced = setup_tracing(engine.config, engine)
    handler = CompletionHandler(engine, traced=traced)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            engine.stop()
            if traced:
                shutdown_tracing()

    app = FastAPI(title="tiny-llm", lifespan=lifespan)
    app.state.engine = engine
    app.state.handler = handler

    @app.exception_handler(CompletionError)
    @app.exception_handler(ValueError)
    @app.exception_handler(RuntimeError)
    async def _on_error(request: Request, exc: Exception) -> JSONResponse:
        status = error_status(exc)
        return JSONResponse(_error_body(str(exc), status), status_code=status)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        return await handler.handle(request, body)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        scheduler = engine.scheduler
        return {
            "status": "ok",
            "model": engine.config.model_name,
            "device": str(engine.device),
            "running": scheduler.running,
            "queue_depth": scheduler.queue_depth,
            "kv_usage": scheduler.cache.usage(),
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": engine.config.model_name, "object": "model", "owned_by": "tokentrace"}],
        }

    return app


class ServerHandle:
    """A uvicorn server running on a background thread (tests and the demo)."""

    def __init__(
        self, app: FastAPI, server: Any, thread: threading.Thread, sock: socket.socket
    ) -> None:
        self.app = app
        self._server = server
        self._thread = thread
        self._sock = sock
        self.host, self.port = sock.getsockname()[:2]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_in_thread(
    app: FastAPI, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 60.0
) -> ServerHandle:
    """Start `app` under uvicorn on a daemon thread and return once it accepts connections.

    The socket is bound here, so port=0 yields a free port without a race.
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="tiny-llm-uvicorn", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError("tiny-llm server did not start")
        time.sleep(0.01)
    return ServerHandle(app, server, thread, sock)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Tiny real LLM server (OpenAI-compatible /v1/completions). Each setting: "
        "this flag, else its TINY_LLM_* environment variable (TINY_LLM_MAX_BATCH_SIZE), else "
        "the default."
    )
    parser.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port (default 8000)")
    parser.add_argument(
        "--fd",
        type=int,
        default=None,
        help="serve on this inherited socket, already bound and listening, instead of binding "
        "--host/--port (a parent that holds the port from the start hands it over: no race)",
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=None,
        help=f"most sequences running at once (default {ServerConfig.max_batch_size})",
    )
    parser.add_argument(
        "--max-tokens-per-step",
        type=int,
        default=None,
        help="token budget of one engine step: a decoding sequence costs 1, a prefill its "
        f"(chunk of) prompt tokens (default {ServerConfig.max_tokens_per_step})",
    )
    parser.add_argument(
        "--chunk-size", type=int, default=None, help="prefill chunk size (default: unchunked)"
    )
    parser.add_argument(
        "--batch-delay-ms",
        type=float,
        default=None,
        help="hold a waiting request up to this long so more can join its batch "
        f"(default {ServerConfig.batch_delay_ms}: no wait)",
    )
    parser.add_argument(
        "--no-prefill-interrupt",
        action="store_true",
        help="do not admit new prefills while sequences decode (smooth streams, longer queue_wait)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help=f"seed of the model's random weights (default {ServerConfig.seed})",
    )
    parser.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    parser.add_argument(
        "--tokenizer",
        choices=["bpe", "byte"],
        default=None,
        help=f"bpe: trained at start-up; byte: one token a byte (default {ServerConfig.tokenizer})",
    )
    parser.add_argument(
        "--otlp-endpoint", default=None, help="trace with tokentrace to this OTLP/HTTP endpoint"
    )
    parser.add_argument("--service-name", default=None, help="service.name (default: model name)")
    parser.add_argument("--environment", default=None, help="deployment.environment.name")
    parser.add_argument("--no-warmup", action="store_true", help="skip the start-up request")
    parser.add_argument(
        "--lazy-load", action="store_true", help="load the weights on the first request"
    )
    parser.add_argument("--log-level", default="info", help="uvicorn's log level (default info)")
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """Return the server config: CLI flags, then TINY_LLM_* variables, then defaults."""
    return ServerConfig.from_env(
        host=args.host,
        port=args.port,
        max_batch_size=args.max_batch_size,
        max_tokens_per_step=args.max_tokens_per_step,
        prefill_chunk_size=args.chunk_size,
        batch_delay_ms=args.batch_delay_ms,
        prefill_interrupts_decode=False if args.no_prefill_interrupt else None,
        threads=args.threads,
        seed=args.seed,
        device=args.device,
        tokenizer=args.tokenizer,
        otlp_endpoint=args.otlp_endpoint,
        service_name=args.service_name,
        environment=args.environment,
        warmup=False if args.no_warmup else None,
        lazy_load=True if args.lazy_load else None,
    )


def main(argv: list[str] | None = None) -> None:
    """Run the server in the foreground under uvicorn."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE

    args = _parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    config = config_from_args(args)
    if args.fd is None:
        uvicorn.run(
            create_app(config), host=config.host, port=config.port, log_level=args.log_level
        )
        return
    # uvicorn's own fd= reads the descriptor as a Unix socket; socket(fileno=) reads its family
    sock = socket.socket(fileno=args.fd)
    server = uvicorn.Server(uvicorn.Config(create_app(config), log_level=args.log_level))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if not server.started:
        sys.exit(STARTUP_FAILURE)  # as uvicorn.run says it


def iter_sse_data(lines: Iterator[str]) -> Iterator[str]:
    """Yield the payload of each `data:` line of an SSE stream (a helper for clients and tests)."""
    for line in lines:
        if line.startswith("data:"):
            yield line[5:].strip()


if __name__ == "__main__":
    main()
