"""TTFT (user) is the first token, not the first byte of the body.

A real server on 127.0.0.1 plays scripted `text/event-stream` bodies (what is written and
when); the real httpx and openai clients read them through the instrumentation.  Of an
event stream a client chunk is an event that carries a token, at the time of the read that
completed it: the OpenAI role-only first delta, `: ping` keep-alives, `[DONE]`, a
finish-only or usage-only last chunk and Anthropic's `message_start` / `ping` /
`content_block_*` events are no chunk.  A body that is no event stream keeps a chunk per
read.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from starlette.requests import Request
from tt_testkit import free_port

from tests.instrumentation._http_app import run_app
from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc

#: how long the scripted servers wait before their first token (s)
WAIT_S = 0.3
#: a lower bound for a time measured after WAIT_S (the client's clock starts first, so only
#: scheduling could make it less; a little is left for timer granularity)
AT_LEAST_US = int(WAIT_S * 1e6) - 20_000
TOKENS = 4
#: how long after the last token the events that end a stream come (s): far more than the
#: 8 ms the test asks of the gap, so a client thread read late on a loaded machine still
#: shows the last token apart from them (0.01 s once gave 7.4 ms under a full test run)
TAIL_S = 0.05
BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m"}


def _event(obj: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(obj)}\n\n".encode()


def _chat(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return _event({**BASE, "choices": [choice]})


ROLE = _chat({"role": "assistant", "content": ""})
FINISH = _chat({}, "stop")
USAGE = _event({**BASE, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
DONE = b"data: [DONE]\n\n"


def _token(i: int) -> bytes:
    return _chat({"content": f" t{i}"})


def _anthropic(kind: str, **fields: Any) -> bytes:
    return _event({"type": kind, **fields}, kind)


#: name -> (content type, [(seconds to wait, bytes to write)], token events in it)
SCRIPTS: dict[str, tuple[str, list[tuple[float, bytes]], int]] = {
    # vLLM / SGLang: the role-only delta at once, the tokens once the request is scheduled;
    # then finish-only, usage-only, [DONE]
    "role_first": (
        "text/event-stream",
        [(0, ROLE), (WAIT_S, _token(0))]
        + [(0.01, _token(i)) for i in range(1, TOKENS)]
        + [(TAIL_S, FINISH), (0.01, USAGE), (0.01, DONE)],
        TOKENS,
    ),
    # keep-alive comments while the request is queued
    "pings": (
        "text/event-stream; charset=utf-8",
        [(0, b": ping\n\n")]
        + [(WAIT_S / 3, b": ping\n\n")] * 2
        + [(WAIT_S / 3, _token(i)) if i == 0 else (0.01, _token(i)) for i in range(TOKENS)]
        + [(TAIL_S, DONE)],
        TOKENS,
    ),
    # the first token's event written in two pieces WAIT_S apart: its time is the second's
    "split": (
        "text/event-stream",
        [(0, _token(0)[:25]), (WAIT_S, _token(0)[25:])]
        + [(0.01, _token(i)) for i in range(1, TOKENS)]
        + [(TAIL_S, DONE)],
        TOKENS,
    ),
    # all the tokens in one write (one read): a chunk each, at that read's time
    "one_read": (
        "text/event-stream",
        [(0, ROLE), (WAIT_S, b"".join(_token(i) for i in range(TOKENS)) + FINISH + DONE)],
        TOKENS,
    ),
    # an Anthropic Messages stream
    "anthropic": (
        "text/event-stream",
        [
            (0, _anthropic("message_start", message={"id": "msg_1", "content": [], "usage": {}})),
            (0, _anthropic("ping")),
            (0, _anthropic("content_block_start", index=0, content_block={"type": "text", "text": ""})),
            (WAIT_S, _anthropic("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hi"})),
        ]
        + [
            (0.01, _anthropic("content_block_delta", index=0, delta={"type": "text_delta", "text": f" {i}"}))
            for i in range(1, TOKENS)
        ]
        + [
            (TAIL_S, _anthropic("content_block_stop", index=0)),
            (0.01, _anthropic("message_delta", delta={"stop_reason": "end_turn"}, usage={})),
            (0.01, _anthropic("message_stop")),
        ],
        TOKENS,
    ),  # fmt: skip
    # no event stream: a chunk per read, the first at once (unchanged)
    "ndjson": (
        "application/x-ndjson",
        [(0, b'{"role": "assistant"}\n')] + [(WAIT_S / 2, b'{"t": 1}\n')] * 2,
        0,
    ),
}


def _app() -> FastAPI:
    app = FastAPI()

    async def play(steps: list[tuple[float, bytes]]) -> AsyncIterator[bytes]:
        for wait_s, data in steps:
            if wait_s:
                await asyncio.sleep(wait_s)
            yield data

    @app.get("/script/{name}")
    async def script(name: str) -> StreamingResponse:
        media, steps, _ = SCRIPTS[name]
        return StreamingResponse(play(steps), headers={"content-type": media})

    @app.get("/gzip")
    async def gzipped() -> StreamingResponse:
        # an event stream sent compressed: its bytes cannot be read before httpx decodes
        # them, so a chunk per read (not none)
        async def body() -> AsyncIterator[bytes]:
            yield gzip.compress(ROLE + _token(0) + DONE)

        headers = {"content-type": "text/event-stream", "content-encoding": "gzip"}
        return StreamingResponse(body(), headers=headers)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        assert body["stream"] is True
        _, steps, _ = SCRIPTS["role_first"]
        return StreamingResponse(play(steps), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with run_app(_app(), free_port()) as base:
        yield base


def _offsets(span: Any) -> list[int]:
    return sc.unpack_list(span.attributes.get(sc.CLIENT_CHUNK_OFFSETS_US, "[]"))


def _read_sync(memory_sdk, url: str, path: str) -> tuple[Any, bytes]:  # type: ignore[no-untyped-def]
    memory_sdk.exporter.clear()
    with httpx.Client() as client:
        tt.instrument_httpx(client)
        with client.stream("GET", url + path) as resp:
            body = b"".join(resp.iter_bytes())
    (span,) = memory_sdk.spans(sc.SPAN_CLIENT)
    return span, body


def _read_async(memory_sdk, url: str, path: str) -> tuple[Any, bytes]:  # type: ignore[no-untyped-def]
    memory_sdk.exporter.clear()

    async def main() -> bytes:
        async with httpx.AsyncClient() as client:
            tt.instrument_httpx(client)
            async with client.stream("GET", url + path) as resp:
                return b"".join([part async for part in resp.aiter_bytes()])

    body = asyncio.run(main())
    (span,) = memory_sdk.spans(sc.SPAN_CLIENT)
    return span, body


@pytest.mark.slow
@pytest.mark.parametrize("read", [_read_sync, _read_async], ids=["sync", "async"])
@pytest.mark.parametrize("name", ["role_first", "pings", "split", "anthropic"])
def test_first_chunk_is_the_first_token(memory_sdk, url: str, name: str, read: Any) -> None:  # type: ignore[no-untyped-def]
    media, steps, tokens = SCRIPTS[name]
    span, body = read(memory_sdk, url, f"/script/{name}")
    assert body == b"".join(data for _, data in steps)  # the body passes untouched
    offsets = _offsets(span)
    assert len(offsets) == span.attributes[sc.CLIENT_CHUNKS] == tokens  # a chunk per token
    assert offsets[0] >= AT_LEAST_US  # not the role delta / ping / message_start at once
    assert span.attributes[sc.CLIENT_TTFC_S] == pytest.approx(offsets[0] / 1e6, abs=1e-6)
    assert offsets == sorted(offsets)
    # the last chunk is the last token, not the finish / usage / [DONE] / message_stop after
    # it: those come TAIL_S and more later, and the span ends after them
    end_us = (span.end_time - span.start_time) / 1000
    assert end_us - offsets[-1] >= 8_000


@pytest.mark.slow
def test_several_events_in_one_read_get_that_reads_time(memory_sdk, url: str) -> None:  # type: ignore[no-untyped-def]
    span, _ = _read_sync(memory_sdk, url, "/script/one_read")
    offsets = _offsets(span)
    assert len(offsets) == TOKENS and len(set(offsets)) == 1  # one time: the read's
    assert offsets[0] >= AT_LEAST_US


@pytest.mark.slow
def test_a_body_that_is_no_event_stream_keeps_a_chunk_per_read(memory_sdk, url: str) -> None:  # type: ignore[no-untyped-def]
    span, _ = _read_async(memory_sdk, url, "/script/ndjson")
    offsets = _offsets(span)
    assert len(offsets) == 3  # each write came as a read of its own, WAIT_S / 2 apart
    assert offsets[0] < AT_LEAST_US / 2  # the first read counts, whatever it holds
    assert offsets[2] - offsets[0] >= AT_LEAST_US - 20_000


def test_a_compressed_event_stream_keeps_a_chunk_per_read(memory_sdk, url: str) -> None:  # type: ignore[no-untyped-def]
    span, body = _read_sync(memory_sdk, url, "/gzip")
    assert body == ROLE + _token(0) + DONE  # decoded by httpx, past the instrumented stream
    assert span.attributes[sc.CLIENT_CHUNKS] >= 1


@pytest.mark.slow
def test_openai_stream_chunks_are_its_tokens(memory_sdk, url: str) -> None:  # type: ignore[no-untyped-def]
    """openai 3 reads through httpx2: a chunk per content delta, the first after the wait
    (its role-only first delta, finish-only and usage-only last chunks are none)."""
    openai = pytest.importorskip("openai")
    tt.instrument_openai()
    try:
        with openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as client:
            stream = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            got = [c.choices[0].delta.content for c in stream if c.choices]

        async def call() -> list[str | None]:
            aclient = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
            astream = await aclient.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            out = [c.choices[0].delta.content async for c in astream if c.choices]
            await aclient.close()
            return out

        got_async = asyncio.run(call())
    finally:
        tt.uninstrument_openai()
    assert got == got_async == ["", " t0", " t1", " t2", " t3", None]  # role, tokens, finish
    spans = memory_sdk.spans(sc.SPAN_CLIENT)
    assert len(spans) == 2
    for span in spans:
        offsets = _offsets(span)
        assert len(offsets) == TOKENS == sum(bool(text) for text in got)
        assert offsets[0] >= AT_LEAST_US
        assert span.attributes[sc.CLIENT_TTFC_S] >= AT_LEAST_US / 1e6


@pytest.mark.slow
def test_the_manual_path_counts_as_the_wrapper_does(memory_sdk, url: str) -> None:  # type: ignore[no-untyped-def]
    """`cr.sse_line(line)` on every line `aiter_lines()` gives (docs/sdk.md §7) counts the
    chunks the httpx integration counts."""

    async def main(name: str) -> None:
        async with tt.client_request(model="m") as cr:
            async with httpx.AsyncClient() as client:  # not instrumented: the manual path
                async with client.stream("GET", f"{url}/script/{name}", headers=cr.headers()) as resp:
                    async for line in resp.aiter_lines():
                        cr.sse_line(line)

    for name in ("role_first", "pings", "split", "one_read", "anthropic"):
        memory_sdk.exporter.clear()
        asyncio.run(main(name))
        (manual,) = memory_sdk.spans(sc.SPAN_CLIENT)
        wrapped, _ = _read_async(memory_sdk, url, f"/script/{name}")
        assert len(_offsets(manual)) == len(_offsets(wrapped)) == SCRIPTS[name][2], name
        assert _offsets(manual)[0] >= AT_LEAST_US, name


def test_sse_line_takes_bytes_and_whole_events(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """`requests`' `iter_lines()` gives bytes; a reader of its own may hand over whole events."""
    with tt.client_request() as cr:
        for line in (ROLE + _token(0) + b": ping\n\n" + DONE).replace(b"\n", b"\r\n").splitlines():
            cr.sse_line(line)
        assert cr.chunk_count == 1
        cr.sse_line((_token(1) + FINISH + _token(2)).decode())  # whole events, as text
        assert cr.chunk_count == 3
        cr.sse_line(_token(3).rstrip(b"\n"))  # an event whose blank line is still to come
        assert cr.chunk_count == 3
        cr.sse_line("")
        assert cr.chunk_count == 4
    (span,) = memory_sdk.spans(sc.SPAN_CLIENT)
    assert span.attributes[sc.CLIENT_CHUNKS] == 4


# ---------------------------------------------------------------- the parser itself


STREAMS = {
    "openai": ROLE + b"".join(_token(i) for i in range(TOKENS)) + FINISH + USAGE + DONE,
    "anthropic": b"".join(data for _, data in SCRIPTS["anthropic"][1]),
    "crlf": (ROLE + _token(0) + b": ping\n\n" + _token(1) + DONE).replace(b"\n", b"\r\n"),
    "cr": (_token(0) + _token(1)).replace(b"\n", b"\r"),
    "multi-line data": b"data: {\"choices\": [{\"delta\":\ndata: {\"content\": \"x\"}}]}\n\n" + DONE,
    "bom": b"\xef\xbb\xbf" + _token(0) + DONE,
    "no blank line at the end": _token(0) + b"data: {\"late\": 1}\n",
}


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_the_parser_counts_alike_however_the_body_is_cut(name: str) -> None:
    from tokentrace.instrumentation._client import SseEvents

    body = STREAMS[name]
    expected = {"openai": TOKENS, "anthropic": TOKENS, "crlf": 2, "cr": 2}.get(name, 1)
    # (a byte-order mark is looked for whole, in the first read)
    for size in (len(body), 3, 4, 7, 64) if name == "bom" else (len(body), 1, 2, 3, 7, 64):
        parser = SseEvents()
        got = sum(parser.feed(body[i : i + size]) for i in range(0, len(body), size))
        assert got == expected, (name, size)
    lines = SseEvents()  # the manual path: lines as `aiter_lines()` gives them
    text = body.removeprefix(b"\xef\xbb\xbf")
    assert sum(lines.line(one) for one in text.splitlines()) == expected


@pytest.mark.parametrize(
    ("data", "token"),
    [
        (b"[DONE]", False),
        (b"", False),
        (b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}', False),
        (b'{"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}', False),
        (b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}', False),
        (b'{"choices":[],"usage":{"total_tokens":7}}', False),
        (b'{"choices":[{"index":0,"text":"","finish_reason":"length"}]}', False),
        (b'{"type":"ping"}', False),
        (b'{"type":"message_delta","delta":{"stop_reason":"end_turn"}}', False),
        (b'{"error":{"message":"boom","type":"x"}}', False),
        (b'{"choices":[{"index":0,"delta":{"content":"hi"}}]}', True),
        (b'{"choices": [{"index": 0, "delta": {"content": "\\"q"}}]}', True),
        (b'{"choices":[{"index":0,"delta":{"content":""}},{"index":1,"delta":{"content":"b"}}]}', True),
        (b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}', True),
        (b'{"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"hm"}}]}', True),
        (b'{"choices":[{"index":0,"delta":{"reasoning":"hm"}}]}', True),
        (b'{"choices":[{"index":0,"text":" x"}]}', True),
        (b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}', True),
        (b'{"index":1,"token":{"id":5,"text":"x"},"generated_text":null}', True),  # TGI
        (b'{"type":"response.output_text.delta","delta":"x"}', True),  # OpenAI Responses API
        (b'{"type":"response.function_call_arguments.delta","delta":"{"}', True),
        (b'{"type":"response.created","sequence_number":0,"response":{"output":[]}}', False),
        (b'{"type":"response.in_progress","sequence_number":1}', False),
        (b'{"type":"response.output_text.done","text":"x y"}', False),
        (b'{"type":"response.completed","response":{"status":"completed"}}', False),
        (b'{"choices": "odd"}', True),
        (b"plain text", True),
        (b"{not json", True),
    ],
)
def test_which_event_data_is_a_token(data: bytes, token: bool) -> None:
    from tokentrace.instrumentation._client import sse_data_is_token

    assert sse_data_is_token(data) is token
