"""Inside a request its span is OpenTelemetry's current span: calls made there join its trace.

A gateway's instrumented httpx call, or the host's own OpenTelemetry span, started
inside `tt.request()` (or a decorated handler) is a child of the request span, so
user → gateway → backend stays one trace.  The context is restored on exit, also
when the body raises, and is per thread and per asyncio task (contextvars).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = "00f067aa0ba902b7"


def _current_ids() -> tuple[int, int]:
    ctx = trace.get_current_span().get_span_context()
    return ctx.trace_id, ctx.span_id


def _ids(req: tt.RequestTrace) -> tuple[int, int]:
    ctx = req.span.get_span_context()
    return ctx.trace_id, ctx.span_id


def _by_id(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {str(s.attributes[sc.REQUEST_ID]): s for s in spans if s.name == sc.SPAN_REQUEST}


def _child_of(child: ReadableSpan, parent: ReadableSpan) -> bool:
    return (
        child.parent is not None
        and child.context.trace_id == parent.context.trace_id
        and child.parent.span_id == parent.context.span_id
    )


def test_inside_a_request_its_span_is_current_and_restored_after(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    host = memory_sdk.tracing.provider.get_tracer("host")
    before = trace.get_current_span()
    with tt.request(request_id="r", headers={"traceparent": f"00-{TRACE}-{CALLER}-01"}) as req:
        assert _current_ids() == _ids(req)
        with host.start_as_current_span("host.db_call"):
            pass
    assert trace.get_current_span() is before
    spans = memory_sdk.spans()
    (db,) = [s for s in spans if s.name == "host.db_call"]
    request = _by_id(spans)["r"]
    assert f"{request.context.trace_id:032x}" == TRACE  # the caller's trace, continued
    assert _child_of(db, request)


def test_the_context_is_restored_when_the_body_raises(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    host = memory_sdk.tracing.provider.get_tracer("host")
    error = KeyError("k")
    with host.start_as_current_span("host.outer") as outer:
        with pytest.raises(KeyError) as raised:
            with tt.request():
                raise error
        assert raised.value is error
        assert trace.get_current_span() is outer
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_an_instrumented_httpx_call_inside_a_request_is_its_child(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """A gateway calling its backend: the backend sees the request span as its parent."""
    seen: list[str] = []

    def backend(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["traceparent"])
        return httpx.Response(200, json={})

    with httpx.Client(transport=httpx.MockTransport(backend)) as client:
        tt.instrument_httpx(client)
        with tt.request(request_id="gw", headers={"traceparent": f"00-{TRACE}-{CALLER}-01"}):
            client.post("http://backend/v1/chat/completions", json={"model": "m"})
    spans = memory_sdk.spans()
    (call,) = [s for s in spans if s.name == sc.SPAN_CLIENT]
    request = _by_id(spans)["gw"]
    assert _child_of(call, request)
    assert seen == [f"00-{TRACE}-{call.context.span_id:016x}-{call.context.trace_flags:02x}"]


def test_concurrent_tasks_and_threads_each_see_their_own_request(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    seen: dict[str, bool] = {}
    both_inside = threading.Barrier(2)

    async def handle(name: str, entered: asyncio.Event, other: asyncio.Event) -> None:
        async with tt.request(request_id=name) as req:
            entered.set()
            await other.wait()  # both tasks inside their requests at once
            seen[name] = _current_ids() == _ids(req)
        seen[name + " after"] = trace.get_current_span() is trace.INVALID_SPAN

    async def main() -> None:
        a, b = asyncio.Event(), asyncio.Event()
        await asyncio.gather(handle("task-a", a, b), handle("task-b", b, a))

    def in_thread(name: str) -> None:
        with tt.request(request_id=name) as req:
            both_inside.wait(5)
            seen[name] = _current_ids() == _ids(req)
            both_inside.wait(5)

    asyncio.run(main())
    threads = [threading.Thread(target=in_thread, args=(n,)) for n in ("thread-a", "thread-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert trace.get_current_span() is trace.INVALID_SPAN
    assert seen == {
        "task-a": True,
        "task-b": True,
        "task-a after": True,
        "task-b after": True,
        "thread-a": True,
        "thread-b": True,
    }


def test_decorated_handlers_and_streams_are_current_while_they_run(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    host = memory_sdk.tracing.provider.get_tracer("host")
    seen: dict[str, bool] = {}

    @tt.traced_request(request_id="sync")
    def handle() -> None:
        host.start_span("in.sync").end()

    @tt.traced_request(request_id="async")
    async def ahandle() -> None:
        await asyncio.sleep(0)
        host.start_span("in.async").end()

    @tt.traced_request(request_id="gen")
    def stream() -> Iterator[int]:
        for i in range(3):
            host.start_span(f"in.gen.{i}").end()
            yield i

    @tt.traced_request(request_id="agen")
    async def astream() -> AsyncIterator[int]:
        for i in range(3):
            await asyncio.sleep(0)
            host.start_span(f"in.agen.{i}").end()
            yield i

    async def consume() -> None:
        await ahandle()
        async for _ in astream():
            # between items the consumer's code is not inside the request
            seen["agen between"] = trace.get_current_span() is trace.INVALID_SPAN

    handle()
    for _ in stream():
        seen["gen between"] = trace.get_current_span() is trace.INVALID_SPAN
    asyncio.run(consume())
    spans = memory_sdk.spans()
    requests = _by_id(spans)
    parents = {"in.sync": "sync", "in.async": "async", "in.gen": "gen", "in.agen": "agen"}
    children = [s for s in spans if s.name.startswith("in.")]
    assert len(children) == 8
    for child in children:
        key = child.name if child.name in parents else child.name.rsplit(".", 1)[0]
        assert _child_of(child, requests[parents[key]]), child.name
    assert seen == {"gen between": True, "agen between": True}


def test_with_the_hosts_own_provider_its_live_span_is_current() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tt.configure(tracer_provider=provider)
    try:
        with tt.request(request_id="host-provider") as req:
            assert trace.get_current_span() is req.span
            provider.get_tracer("host").start_span("host.call").end()
        tt.get_tracing().force_flush(5_000)
    finally:
        tt.shutdown()
    spans = list(exporter.get_finished_spans())
    (call,) = [s for s in spans if s.name == "host.call"]
    assert _child_of(call, _by_id(spans)["host-provider"])


def test_disabled_leaves_the_hosts_context_alone() -> None:
    tt.configure(disabled=True)
    try:
        with tt.request() as req:
            assert tt.current_request() is req
            assert trace.get_current_span() is trace.INVALID_SPAN
    finally:
        tt.shutdown()
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_a_gateways_call_to_its_backend_continues_the_users_trace(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """user → gateway (instrument_fastapi) → backend (instrumented httpx): one trace."""
    from fastapi import FastAPI

    seen: list[str] = []

    def backend(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["traceparent"])
        return httpx.Response(200, json={})

    gateway = FastAPI()
    tt.instrument_fastapi(gateway)

    @gateway.get("/chat")
    async def chat() -> dict[str, str]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(backend)) as client:
            tt.instrument_httpx(client)
            await client.post("http://backend/v1/chat/completions", json={"model": "m"})
        return {}

    async def user() -> None:
        transport = httpx.ASGITransport(app=gateway)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            await client.get("/chat", headers={"traceparent": f"00-{TRACE}-{CALLER}-01"})

    asyncio.run(user())
    spans = memory_sdk.spans()
    (request,) = [s for s in spans if s.name == sc.SPAN_REQUEST]
    (call,) = [s for s in spans if s.name == sc.SPAN_CLIENT]
    assert f"{request.context.trace_id:032x}" == TRACE
    assert _child_of(call, request)
    assert seen == [f"00-{TRACE}-{call.context.span_id:016x}-{call.context.trace_flags:02x}"]
