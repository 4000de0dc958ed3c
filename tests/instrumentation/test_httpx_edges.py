"""httpx edges met by real hosts: a streamed response its reader stops early (`break` out of
`iter_lines()`: no error, as on the server side) or that fails mid-stream (an error), and a
request carrying a `traceparent` already: one copied from elsewhere (a proxy forwarding
the incoming request's headers) is replaced by our client span's, one naming the current
span (another instrumentation's client span) is left alone.  Servers are real (uvicorn on
127.0.0.1)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from tt_testkit import free_port

from tests.instrumentation._http_app import run_app
from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc

LINES = 40
#: a traceparent of a span that is not ours and not current (another trace altogether)
STALE_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
STALE = f"00-{STALE_TRACE}-00f067aa0ba902b7-01"
PROPAGATOR = TraceContextTextMapPropagator()


def _serve(app: FastAPI) -> AbstractContextManager[str]:
    return run_app(app, free_port(), log_level="critical")


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/lines")
    async def lines() -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            for i in range(LINES):
                yield f"line {i}\n".encode()
                await asyncio.sleep(0.005)

        return StreamingResponse(body(), media_type="text/plain")

    @app.get("/stall")
    async def stall() -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            yield b"first\n"
            await asyncio.sleep(1.0)  # past the client's read timeout
            yield b"late\n"

        return StreamingResponse(body(), media_type="text/plain")

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, str | None]:
        return {k: request.headers.get(k) for k in ("traceparent", "tracestate", "baggage")}

    return app


def _traceparent_of(span: Any) -> str:
    c = span.context
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"


def _stopped_without_error(span: Any) -> None:
    """The reader stopped: marked disconnected, status unset, no exception recorded."""
    assert span.attributes.get(sc.REQUEST_DISCONNECTED) is True
    assert span.status.status_code is StatusCode.UNSET
    assert not [e for e in span.events if e.name == "exception"]


# ---------------------------------------------------------------- 1. a stream read in part


@pytest.mark.slow
@pytest.mark.parametrize("how", ["iter_lines", "iter_bytes", "iter_raw"])
def test_sync_stream_left_by_break_is_no_error(memory_sdk, how: str) -> None:  # type: ignore[no-untyped-def]
    with _serve(_app()) as url, httpx.Client(timeout=10) as client:
        tt.instrument_httpx(client)
        with client.stream("GET", url + "/lines") as response:
            for i, _ in enumerate(getattr(response, how)()):
                if i == 1:
                    break
        with client.stream("GET", url + "/lines") as response:  # read to its end: the control
            assert len(list(response.iter_lines())) == LINES
        stopped, read = memory_sdk.wait_for(sc.SPAN_CLIENT, 2)
    _stopped_without_error(stopped)
    assert stopped.attributes[sc.HTTP_STATUS] == 200 and stopped.attributes[sc.CLIENT_CHUNKS] >= 1
    assert sc.REQUEST_DISCONNECTED not in read.attributes and read.status.is_ok


@pytest.mark.parametrize("generator_closed_first", [False, True])
def test_async_stream_left_by_break_is_no_error(memory_sdk, generator_closed_first: bool) -> None:  # type: ignore[no-untyped-def]
    """`async for ... break`: `async with` closes the response before asyncio's finalizer
    closes the abandoned generator; or the reader closes the generator itself first."""

    async def main(url: str) -> None:
        async with httpx.AsyncClient(timeout=10) as client:
            tt.instrument_httpx(client)
            async with client.stream("GET", url + "/lines") as response:
                lines = response.aiter_lines()
                async for _ in lines:
                    break
                if generator_closed_first:
                    await lines.aclose()  # type: ignore[attr-defined]
            await asyncio.sleep(0.05)  # asyncio's finalizer runs what it was left

    with _serve(_app()) as url:
        asyncio.run(main(url))
        (span,) = memory_sdk.wait_for(sc.SPAN_CLIENT, 1)
    _stopped_without_error(span)


@pytest.mark.slow
def test_read_timeout_mid_stream_stays_an_error(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    with _serve(_app()) as url, httpx.Client(timeout=httpx.Timeout(10, read=0.3)) as client:
        tt.instrument_httpx(client)
        with pytest.raises(httpx.ReadTimeout):
            with client.stream("GET", url + "/stall") as response:
                for _ in response.iter_lines():
                    pass
        (span,) = memory_sdk.wait_for(sc.SPAN_CLIENT, 1)
    assert span.status.status_code is StatusCode.ERROR and "ReadTimeout" in span.status.description
    assert [e.attributes["exception.type"] for e in span.events if e.name == "exception"] == [
        "httpx.ReadTimeout"
    ]
    assert sc.REQUEST_DISCONNECTED not in span.attributes


# ---------------------------------------------------------------- 2. a traceparent sent already


def test_traceparent_copied_from_elsewhere_is_replaced_by_ours(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """No span current (a gateway tracing its calls only): our client span continues the
    trace the copied `traceparent` names, with its `tracestate`, and replaces it."""
    copied = {"traceparent": STALE, "tracestate": "vendor=stale", "baggage": "tenant=acme"}
    with _serve(_app()) as url, httpx.Client(timeout=10) as client:
        tt.instrument_httpx(client)
        got = client.post(url + "/echo", headers=copied).json()
        (span,) = memory_sdk.wait_for(sc.SPAN_CLIENT, 1)
    assert span.kind is SpanKind.CLIENT and span.attributes[sc.URL_PATH] == "/echo"
    assert got["traceparent"] == _traceparent_of(span)
    assert f"{span.context.trace_id:032x}" == STALE_TRACE
    assert f"{span.parent.span_id:016x}" == STALE.split("-")[2]
    # the caller's tracestate goes on with its trace; baggage is the host's
    assert got["tracestate"] == "vendor=stale" and got["baggage"] == "tenant=acme"


def test_traceparent_copied_under_a_current_span_keeps_its_tracestate(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """A proxy's request span continued the incoming traceparent + tracestate; the headers
    it forwards carry them both: our client span is the request span's child, and sends
    the tracestate the trace came with."""
    incoming = {"traceparent": STALE, "tracestate": "vendor=live"}
    parent = otel_context.attach(PROPAGATOR.extract(incoming))
    try:
        with memory_sdk.tracing.tracer.start_as_current_span("proxy.request") as server:
            with httpx.Client(timeout=10) as client, _serve(_app()) as url:
                tt.instrument_httpx(client)
                got = client.post(url + "/echo", headers=dict(incoming)).json()
    finally:
        otel_context.detach(parent)
    (span,) = memory_sdk.wait_for(sc.SPAN_CLIENT, 1)
    assert span.parent.span_id == server.get_span_context().span_id
    assert got["traceparent"] == _traceparent_of(span) and got["tracestate"] == "vendor=live"


def test_traceparent_of_the_current_span_is_traced_already(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """Another instrumentation started its client span as current and injected it: no
    second client span, its traceparent sent unchanged."""
    with _serve(_app()) as url, httpx.Client(timeout=10) as client:
        tt.instrument_httpx(client)
        with memory_sdk.tracing.tracer.start_as_current_span("other.client", kind=SpanKind.CLIENT):
            headers: dict[str, str] = {}
            PROPAGATOR.inject(headers)
            got = client.post(url + "/echo", headers=headers).json()
        assert got["traceparent"] == headers["traceparent"]
        # the same headers sent again outside that span: copied, stale now, so ours
        again = client.post(url + "/echo", headers=headers).json()
        (span,) = memory_sdk.wait_for(sc.SPAN_CLIENT, 1)
    assert again["traceparent"] == _traceparent_of(span)
    assert [s.name for s in memory_sdk.spans() if s.kind is SpanKind.CLIENT] == [
        "other.client",
        sc.SPAN_CLIENT,
    ]


@pytest.mark.slow
def test_gateway_forwarding_the_incoming_headers_keeps_the_trace_tree(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """user client → gateway (instrumented server + client, forwarding the incoming headers
    as proxies do) → backend: the backend's request is the gateway client span's child."""
    backend = FastAPI()

    @backend.post("/gen")
    async def gen() -> dict[str, bool]:
        return {"ok": True}

    gateway = FastAPI()
    hop_by_hop = {"host", "content-length", "connection", "accept-encoding"}

    @gateway.post("/v1/gen")
    async def proxy(request: Request) -> Any:
        forwarded = {k: v for k, v in request.headers.items() if k not in hop_by_hop}
        async with httpx.AsyncClient(timeout=10) as onward:
            tt.instrument_httpx(onward)
            answer = await onward.post(
                gateway.state.backend + "/gen", content=await request.body(), headers=forwarded
            )
        return answer.json()

    with _serve(tt.instrument_fastapi(backend)) as backend_url:
        gateway.state.backend = backend_url
        with _serve(tt.instrument_fastapi(gateway)) as gateway_url:
            with httpx.Client(timeout=10) as user:
                tt.instrument_httpx(user)
                assert user.post(gateway_url + "/v1/gen", json={"model": "m"}).json() == {
                    "ok": True
                }
            clients = memory_sdk.wait_for(sc.SPAN_CLIENT, 2)
            requests = memory_sdk.wait_for(sc.SPAN_REQUEST, 2)
    (user_call,) = [s for s in clients if s.attributes[sc.URL_PATH] == "/v1/gen"]
    (gateway_call,) = [s for s in clients if s.attributes[sc.URL_PATH] == "/gen"]
    (gateway_request,) = [s for s in requests if s.attributes.get(sc.URL_PATH) == "/v1/gen"]
    (backend_request,) = [s for s in requests if s.attributes.get(sc.URL_PATH) == "/gen"]
    assert gateway_request.parent.span_id == user_call.context.span_id
    assert gateway_call.parent.span_id == gateway_request.context.span_id
    assert backend_request.parent.span_id == gateway_call.context.span_id
    assert len({s.context.trace_id for s in (*clients, *requests)}) == 1


@pytest.mark.slow
def test_untraced_gateway_forwarding_headers_continues_the_callers_trace(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """A gateway that traces its calls but not its own requests (no span current there),
    forwarding the caller's `traceparent`: its client span continues the caller's trace
    rather than starting a new one (which would cut the backend off the user's call)."""
    backend = FastAPI()

    @backend.post("/gen")
    async def gen() -> dict[str, bool]:
        return {"ok": True}

    gateway = FastAPI()

    @gateway.post("/v1/gen")
    async def proxy(request: Request) -> Any:
        forwarded = {k: v for k, v in request.headers.items() if k in ("traceparent", "tracestate")}
        async with httpx.AsyncClient(timeout=10) as onward:
            tt.instrument_httpx(onward)
            answer = await onward.post(gateway.state.backend + "/gen", headers=forwarded)
        return answer.json()

    with _serve(tt.instrument_fastapi(backend)) as backend_url:
        gateway.state.backend = backend_url
        with _serve(gateway) as gateway_url:  # not instrumented: no request span there
            with httpx.Client(timeout=10) as user:
                tt.instrument_httpx(user)
                assert user.post(gateway_url + "/v1/gen", json={"model": "m"}).json() == {
                    "ok": True
                }
            clients = memory_sdk.wait_for(sc.SPAN_CLIENT, 2)
            (backend_request,) = memory_sdk.wait_for(sc.SPAN_REQUEST, 1)
    (user_call,) = [s for s in clients if s.attributes[sc.URL_PATH] == "/v1/gen"]
    (gateway_call,) = [s for s in clients if s.attributes[sc.URL_PATH] == "/gen"]
    assert gateway_call.parent.span_id == user_call.context.span_id
    assert backend_request.parent.span_id == gateway_call.context.span_id
    assert len({s.context.trace_id for s in (*clients, backend_request)}) == 1
