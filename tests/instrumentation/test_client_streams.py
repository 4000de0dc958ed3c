"""A streamed response dropped unread ends its client span when it is garbage-collected."""

from __future__ import annotations

import asyncio
import gc

import httpx
import pytest
from tt_testkit import free_port

from tests.instrumentation._http_app import make_app, run_app
from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc

pytestmark = pytest.mark.slow


def _client_spans(memory_sdk, count: int) -> list:  # type: ignore[no-untyped-def,type-arg]
    gc.collect()
    return memory_sdk.wait_for(sc.SPAN_CLIENT, count)


def _dropped(span) -> bool:  # type: ignore[no-untyped-def]
    return bool(span.attributes.get(sc.REQUEST_DISCONNECTED)) and span.status.is_ok


def test_sync_stream_dropped_unread_ends_its_span(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    with run_app(tt.instrument_fastapi(make_app()), free_port()) as url:
        with httpx.Client() as client:
            tt.instrument_httpx(client)
            response = client.send(client.build_request("GET", url + "/v1/stream/a"), stream=True)
            assert response.status_code == 200
            del response  # never read, never closed
            (span,) = _client_spans(memory_sdk, 1)
            assert _dropped(span) and span.attributes[sc.HTTP_STATUS] == 200

            with client.stream("GET", url + "/v1/stream/b") as read:
                assert len(list(read.iter_lines())) > 0
            del read
            spans = _client_spans(memory_sdk, 2)
    assert [_dropped(s) for s in spans] == [True, False]  # read to its end: no mark


def test_async_stream_dropped_unread_ends_its_span(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    async def main(url: str) -> None:
        async with httpx.AsyncClient() as client:
            tt.instrument_httpx(client)
            request = client.build_request("GET", url + "/v1/stream/a")
            response = await client.send(request, stream=True)
            assert response.status_code == 200
            del response

    with run_app(tt.instrument_fastapi(make_app()), free_port()) as url:
        asyncio.run(main(url))
        (span,) = _client_spans(memory_sdk, 1)
    assert _dropped(span)
