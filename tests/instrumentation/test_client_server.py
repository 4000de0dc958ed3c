"""Client → server over real HTTP: traceparent continuity, chunk times, network time in serve's rows."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from tt_testkit import free_port

from tests.instrumentation._http_app import (
    TOKENS,
    CompletionCounter,
    make_app,
    run_app,
    wait_completed,
)
from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc


@pytest.fixture
def app_url():  # type: ignore[no-untyped-def]
    app = tt.instrument_fastapi(make_app())
    app.add_middleware(CompletionCounter)  # outside ours: counts after our span ended
    while CompletionCounter.done.acquire(blocking=False):
        pass
    with run_app(app, free_port()) as url:
        yield url


def _stream_with_client_request(url: str) -> int:
    chunks = 0
    with tt.client_request(model="tiny", tenant="acme") as cr:
        with httpx.Client() as client:
            with client.stream(
                "GET", f"{url}/v1/stream/a", headers=cr.headers({"x-user": "u"})
            ) as resp:
                for _line in resp.iter_lines():
                    if _line:
                        cr.chunk()
                        chunks += 1
    return chunks


def test_client_span_is_parent_of_the_server_span(memory_sdk, app_url) -> None:  # type: ignore[no-untyped-def]
    assert _stream_with_client_request(app_url) == TOKENS
    client = memory_sdk.spans(sc.SPAN_CLIENT)[0]
    server = memory_sdk.wait_for(sc.SPAN_REQUEST)[0]
    assert server.context.trace_id == client.context.trace_id
    assert server.parent.span_id == client.context.span_id
    assert server.attributes[sc.ROUTE] == "/v1/stream/{name}"
    assert server.attributes[sc.HTTP_STATUS] == 200
    # token and chunk times go packed: one JSON string each, not an OTLP array
    assert isinstance(server.attributes[sc.TOKEN_OFFSETS_US], str)
    assert isinstance(client.attributes[sc.CLIENT_CHUNK_OFFSETS_US], str)
    assert len(sc.unpack_list(server.attributes[sc.TOKEN_OFFSETS_US])) == TOKENS
    offsets = sc.unpack_list(client.attributes[sc.CLIENT_CHUNK_OFFSETS_US])
    assert len(offsets) == TOKENS and offsets == sorted(offsets)
    assert client.attributes[sc.CLIENT_TTFC_S] == pytest.approx(offsets[0] / 1e6, abs=1e-6)
    assert client.attributes[sc.TENANT] == "acme"
    assert client.end_time - client.start_time > server.end_time - server.start_time


def test_async_client_request(memory_sdk, app_url) -> None:  # type: ignore[no-untyped-def]
    async def main() -> int:
        n = 0
        async with tt.client_request(model="tiny") as cr, httpx.AsyncClient() as client:
            async with client.stream("GET", f"{app_url}/v1/stream/b", headers=cr.headers()) as resp:
                async for line in resp.aiter_lines():
                    if line:
                        cr.chunk()
                        n += 1
        return n

    assert asyncio.run(main()) == TOKENS
    client = memory_sdk.spans(sc.SPAN_CLIENT)[0]
    server = memory_sdk.wait_for(sc.SPAN_REQUEST)[0]
    assert server.parent.span_id == client.context.span_id


def test_errors_recorded_and_reraised(memory_sdk, app_url) -> None:  # type: ignore[no-untyped-def]
    class Gone(Exception):
        pass

    with pytest.raises(Gone):
        with tt.client_request() as cr:
            r = httpx.get(f"{app_url}/boom", headers=cr.headers())
            assert r.status_code == 500
            raise Gone()
    client = memory_sdk.spans(sc.SPAN_CLIENT)[0]
    server = memory_sdk.wait_for(sc.SPAN_REQUEST)[0]
    assert not client.status.is_ok and "Gone" in client.status.description
    assert not server.status.is_ok and server.attributes[sc.ROUTE] == "/boom"
    assert any(e.name == "exception" for e in server.events)


def test_instrumented_httpx_records_chunks_without_manual_calls(memory_sdk, app_url) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client() as client:
        tt.instrument_httpx(client)
        assert tt.instrument_httpx(client) is client  # guard: instrumenting twice is a no-op
        with client.stream("GET", f"{app_url}/v1/stream/c") as resp:
            body = resp.read()
        tt.uninstrument_httpx(client)
        client.get(f"{app_url}/v1/stream/d")  # no longer traced on the client side
    assert body.count(b"data:") == TOKENS
    clients = memory_sdk.spans(sc.SPAN_CLIENT)
    servers = memory_sdk.wait_for(sc.SPAN_REQUEST, 2)
    assert len(clients) == 1 and len(servers) == 2
    assert servers[0].parent.span_id == clients[0].context.span_id
    assert servers[1].parent is None
    assert clients[0].attributes[sc.CLIENT_CHUNKS] >= 1
    assert clients[0].attributes[sc.HTTP_STATUS] == 200


def test_httpx_class_instrumentation_async(memory_sdk, app_url) -> None:  # type: ignore[no-untyped-def]
    tt.instrument_httpx()
    try:

        async def main() -> bytes:
            async with httpx.AsyncClient() as client:
                async with client.stream("GET", f"{app_url}/v1/stream/e") as resp:
                    return b"".join([c async for c in resp.aiter_raw()])

        body = asyncio.run(main())
    finally:
        tt.uninstrument_httpx()
    assert body.count(b"data:") == TOKENS
    client = memory_sdk.spans(sc.SPAN_CLIENT)[0]
    server = memory_sdk.wait_for(sc.SPAN_REQUEST)[0]
    assert server.parent.span_id == client.context.span_id
    assert not isinstance(httpx.AsyncClient.__dict__["send"], type(None))
    import wrapt

    assert not isinstance(httpx.AsyncClient.__dict__["send"], wrapt.FunctionWrapper)


def test_uninstrument_fastapi_removes_the_middleware(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    app = tt.instrument_fastapi(make_app())
    tt.instrument_fastapi(app)
    assert sum(m.cls is tt.TokentraceMiddleware for m in app.user_middleware) == 1
    tt.uninstrument_fastapi(app)
    assert not any(m.cls is tt.TokentraceMiddleware for m in app.user_middleware)


def test_request_from_headers_continues_the_trace(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    with tt.client_request() as cr:
        headers = [(k.upper(), v) for k, v in cr.headers().items()]
        with tt.request_from_headers(headers, model="m"):
            pass
    client = memory_sdk.spans(sc.SPAN_CLIENT)[0]
    server = memory_sdk.wait_for(sc.SPAN_REQUEST)[0]
    assert server.parent.span_id == client.context.span_id


def test_serve_stores_network_and_client_ttft(serve_sdk, app_url) -> None:  # type: ignore[no-untyped-def]
    serve, tracing = serve_sdk
    assert _stream_with_client_request(app_url) == TOKENS
    wait_completed()
    assert tracing.force_flush(10_000)
    serve.stop()
    rows = serve.rows(
        "SELECT network_ms, server_ms, e2e_ms, ttft_client_ms, ttft_ms, route, tenant FROM requests"
    )
    assert rows
    row = rows[0]
    spans = serve.rows("SELECT name, kind, start_ns, end_ns FROM spans")
    network_ms, server_ms, e2e_ms, ttft_client_ms, ttft_ms, route, tenant = row
    by_name = {name: (end - start) / 1e6 for name, _kind, start, end in spans}
    if by_name:  # the trace was kept: check the subtraction against the stored spans
        assert network_ms == pytest.approx(
            by_name[sc.SPAN_CLIENT] - by_name[sc.SPAN_REQUEST], abs=0.01
        )
    assert network_ms > 0
    assert network_ms + server_ms == pytest.approx(e2e_ms, abs=0.01)
    assert ttft_client_ms is not None and ttft_client_ms >= ttft_ms
    assert route == "/v1/stream/{name}"
