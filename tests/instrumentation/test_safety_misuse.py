"""Misuse a real serving loop commits: the host keeps running, nothing is lost unsaid.

The rule: the host's exceptions pass through unchanged; wrong argument types
(ids as ints, counts as strings, `None` for "none") are converted or logged
once, never raised into the host and never lose the other steps or spans.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _safety
from tokentrace.instrumentation import semconv as sc
from tokentrace.instrumentation._steps import current_step

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture(autouse=True)
def fresh_log_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees its own log-once sites (they are once per process otherwise)."""
    monkeypatch.setattr(_safety, "_seen", set())


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "tokentrace"]


def _steps_of(memory_sdk) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
    """Gives every emitted step as {attribute: value}, the packed lists unpacked."""
    steps = []
    for span in memory_sdk.spans(sc.SPAN_ENGINE_STEPS):
        a = span.attributes
        lists = {
            k: sc.unpack_list(a[k]) for k in sc.PACKED_LISTS if k.startswith("tokentrace.step.")
        }
        for i in range(a[sc.STEP_COUNT]):
            steps.append(
                {k: v[i] for k, v in lists.items()} | {"dropped": a.get(sc.STEP_DROPPED, 0)}
            )
    return steps


# ---- engine steps -------------------------------------------------------------


def test_int_request_ids_do_not_lose_the_buffered_steps(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    with tt.engine_step(queue_depth=1, decode=["a"]):
        pass
    with tt.engine_step(queue_depth=2, decode=[7, 8]) as step:  # the scheduler's int ids
        step.prefill(9, 16)
    steps = _steps_of(memory_sdk)
    assert [s[sc.STEP_REQUEST_IDS] for s in steps] == ["a", "7,8,9"]
    assert [s[sc.STEP_BATCH_SIZE] for s in steps] == [1, 3]


def test_step_counts_handed_over_as_strings_are_converted(memory_sdk, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING)
    with tt.engine_step(queue_depth="3", kv_usage="0.5") as step:
        step.prefill("r1", "12")
        step.prefill("r2", 4)
    with tt.engine_step(queue_depth="many", kv_usage=float("nan")):
        pass
    first, second = _steps_of(memory_sdk)
    assert (first[sc.STEP_QUEUE_DEPTH], first[sc.STEP_PREFILL_TOKENS]) == (3, 16)
    assert first[sc.STEP_KV_USAGE] == 0.5
    # what is no number at all is logged once and sent as unknown, the step kept
    assert (second[sc.STEP_QUEUE_DEPTH], second[sc.STEP_KV_USAGE]) == (-1, -1.0)
    logged = _warnings(caplog)
    assert any("queue_depth" in m for m in logged)
    assert any("kv_usage is not finite (nan" in m for m in logged)


def test_engine_step_decode_none_means_no_decodes(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    with tt.engine_step(decode=None) as step:
        step.prefill("r1", 5)
    (only,) = _steps_of(memory_sdk)
    assert (only[sc.STEP_DECODE_SEQS], only[sc.STEP_REQUEST_IDS]) == (0, "r1")


def test_decode_many_none_means_no_decodes(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    with tt.engine_step() as step:
        step.decode_many(None)  # type: ignore[arg-type]
        step.decode_many(["r1"])
    (only,) = _steps_of(memory_sdk)
    assert (only[sc.STEP_DECODE_SEQS], only[sc.STEP_REQUEST_IDS]) == (1, "r1")


def test_request_as_an_async_context_manager(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    async def handle() -> None:
        async with tt.request(request_id="async") as req:
            assert tt.current_request() is req
            req.token()
        assert tt.current_request() is None

    asyncio.run(handle())
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert span.attributes[sc.OUTPUT_TOKENS] == 1


def test_engine_step_tokens_not_a_batch(memory_sdk, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING)
    req = tt.request(request_id="listed")

    class Oom(Exception):
        pass

    # the host's own exception passes unchanged, the step's context is left,
    # and the tokens of a plain list of requests are recorded the slower way
    with pytest.raises(Oom):
        with tt.engine_step(decode=["listed"], tokens=[req]):  # type: ignore[arg-type]
            raise Oom
    assert current_step() is None
    with tt.engine_step(tokens=["listed"]):  # type: ignore[arg-type]
        pass  # ids, not requests: nothing to record them on, said once
    assert current_step() is None
    req.finish()
    span = memory_sdk.spans(sc.SPAN_REQUEST)[0]
    assert len(sc.unpack_list(span.attributes[sc.TOKEN_OFFSETS_US])) == 1
    assert len(_steps_of(memory_sdk)) == 2
    logged = _warnings(caplog)
    assert any("takes a tt.TokenBatch, not list (recorded per request" in m for m in logged)
    assert any("the step's tokens are not recorded" in m for m in logged)


def test_record_step_values_are_checked_off_the_callers_thread(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    def step(**kw: object) -> None:
        args: dict[str, object] = dict(
            start_ns=1_700_000_000_000_000_000,
            end_ns=1_700_000_000_002_000_000,
            prefill_tokens=0,
            decode_seqs=1,
            batch_size=1,
            queue_depth=0,
        )
        tt.record_step(**(args | kw))  # type: ignore[arg-type]

    step(request_ids="req-1")  # one id, not its characters
    step(request_ids=[1, 2], queue_depth="4", kv_usage="full", gpu_us=2500.0)
    step(request_ids=None)
    step(start_ns="yesterday")  # no time, no step: dropped and counted
    steps = _steps_of(memory_sdk)
    assert [s[sc.STEP_REQUEST_IDS] for s in steps] == ["req-1", "1,2", ""]
    second = steps[1]
    assert (second[sc.STEP_QUEUE_DEPTH], second[sc.STEP_KV_USAGE], second[sc.STEP_GPU_US]) == (
        4,
        -1.0,
        2500,
    )
    assert steps[0]["dropped"] == 1


def test_one_decode_id_given_as_a_string_is_one_id(memory_sdk, caplog) -> None:  # type: ignore[no-untyped-def]
    with tt.engine_step(decode="req-1"):
        pass
    with tt.engine_step(decode=["a"]) as step:
        step.decode_many("req-2")
    steps = _steps_of(memory_sdk)
    assert [s[sc.STEP_REQUEST_IDS] for s in steps] == ["req-1", "a,req-2"]
    assert [s[sc.STEP_DECODE_SEQS] for s in steps] == [1, 2]
    assert any("not str (taken as one id)" in m for m in _warnings(caplog))


def test_kv_usage_as_a_percent_is_read_as_one(memory_sdk, caplog) -> None:  # type: ignore[no-untyped-def]
    for usage in (0.0, 0.5, 1.0, 87.5, 100.0, 250.0, -0.2):
        with tt.engine_step(kv_usage=usage):
            pass
    # a percent handed over as such would read as a cache always full
    assert [s[sc.STEP_KV_USAGE] for s in _steps_of(memory_sdk)] == [
        0.0, 0.5, 1.0, 0.875, 1.0, -1.0, -1.0
    ]  # fmt: skip
    logged = _warnings(caplog)
    assert any("kv_usage is the used fraction of the KV cache, 0 to 1 (87.5: read as a percent)" in m for m in logged)
    assert any("kv_usage is outside 0 to 1 (250.0; sent as -1)" in m for m in logged)


def test_record_step_times_not_in_wall_clock_nanoseconds(memory_sdk, caplog) -> None:  # type: ignore[no-untyped-def]
    def step(start: object, end: object, prefill: int) -> None:
        tt.record_step(start_ns=start, end_ns=end, prefill_tokens=prefill, decode_seqs=0,  # type: ignore[arg-type]
                       batch_size=1, queue_depth=0)  # fmt: skip

    step(1_700_000_000_000_000_000, 1_700_000_000_002_000_000, 1)  # time.time_ns(): as is
    step(1_700_000_000.5, 1_700_000_000.502, 2)  # time.time(): read as seconds
    step(5_000_000_000, 5_002_000_000, 3)  # time.monotonic_ns(): no place beside the requests
    step(86_400_000_000_000, 86_400_002_000_000, 4)  # the same, a day after boot
    step(float("inf"), 1_700_000_000_002_000_000, 5)
    steps = _steps_of(memory_sdk)
    assert [s[sc.STEP_PREFILL_TOKENS] for s in steps] == [1, 2]
    span = memory_sdk.spans(sc.SPAN_ENGINE_STEPS)[0]
    starts = sc.unpack_list(span.attributes[sc.STEP_START_NS])
    assert starts == [1_700_000_000_000_000_000, 1_700_000_000_500_000_000]
    assert [s[sc.STEP_DURATION_US] for s in steps] == [2000, 2000]
    assert steps[0]["dropped"] == 3
    logged = _warnings(caplog)
    assert any("given in seconds (time.time()), not time.time_ns() (1700000000.5: read as seconds)" in m
               for m in logged)  # fmt: skip
    assert any("is not a time.time_ns() wall-clock time (5000000000, 5002000000" in m for m in logged)


# ---- requests -----------------------------------------------------------------


def test_request_arguments_of_the_wrong_type(memory_sdk, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING)
    with tt.request(request_id=123) as req:
        assert req.request_id == "123"
        req.token("3")  # a count as text
        req.token(2.0)
        req.token(None)  # type: ignore[arg-type]
        req.set_tokens(prompt="17", output="lots")
        req.end_phase("prefil-typo")
    span = memory_sdk.spans(sc.SPAN_REQUEST)[0]
    assert span.attributes[sc.REQUEST_ID] == "123"
    assert len(sc.unpack_list(span.attributes[sc.TOKEN_OFFSETS_US])) == 5
    assert span.attributes[sc.PROMPT_TOKENS] == 17
    assert span.attributes[sc.OUTPUT_TOKENS] == 5  # "lots" is no count: the token times are
    logged = _warnings(caplog)
    assert any("end_phase() without start_phase() ('prefil-typo': ignored)" in m for m in logged)
    assert any("gen_ai.usage.output_tokens is not a number" in m for m in logged)
    assert any("count is not a number (None" in m for m in logged)


def test_end_phase_misuse_is_logged_once_whatever_the_phase(memory_sdk, caplog) -> None:  # type: ignore[no-untyped-def]
    from tokentrace.instrumentation import _safety

    caplog.set_level(logging.WARNING)
    seen = len(_safety._seen)
    with tt.request() as req:
        for i in range(50):  # names made per request (a phase per tool call, say)
            req.end_phase(f"tool-{i}")
    logged = [m for m in _warnings(caplog) if "without start_phase" in m]
    assert logged == ["tokentrace: end_phase() without start_phase() ('tool-0': ignored) "
                      "(further ones are not logged)"]  # fmt: skip
    assert len(_safety._seen) == seen + 1  # one site kept, not one per name


@pytest.mark.parametrize(
    "headers",
    [
        [(b"host", b"x"), (b"traceparent", TRACEPARENT.encode())],  # raw ASGI scope["headers"]
        {"Host": "x", "Traceparent": TRACEPARENT},  # a framework that keeps the case
    ],
)
def test_request_continues_traceparent_from_raw_headers(memory_sdk, headers) -> None:  # type: ignore[no-untyped-def]
    with tt.request(headers=headers):
        pass
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert span.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert span.parent.span_id == 0xB7AD6B7169203331


def test_client_chunk_counts_of_the_wrong_type(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    with tt.client_request() as cr:
        cr.chunk("2")
        cr.chunk(None)  # type: ignore[arg-type]
    (span,) = memory_sdk.spans(sc.SPAN_CLIENT)
    assert span.attributes[sc.CLIENT_CHUNKS] == 2


def test_token_batch_of_ids_leaves_them_out(memory_sdk, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING)
    req = tt.request(request_id="member")
    batch = tt.TokenBatch([req, "member-2"])  # type: ignore[list-item]
    assert batch.request_ids == ("member",)
    batch.token()
    tt.record_tokens([req, "member-2"])  # type: ignore[list-item]
    req.finish()
    span = memory_sdk.spans(sc.SPAN_REQUEST)[0]
    assert len(sc.unpack_list(span.attributes[sc.TOKEN_OFFSETS_US])) == 2
    logged = _warnings(caplog)
    assert any("TokenBatch takes requests" in m for m in logged)
    assert any("record_tokens takes requests" in m for m in logged)


def test_abandoned_async_stream_still_ends_its_request(memory_sdk, caplog) -> None:  # type: ignore[no-untyped-def]
    """A client that goes away leaves the stream to asyncio's finalizer, in another context."""
    caplog.set_level(logging.WARNING)

    async def stream() -> AsyncIterator[int]:
        with tt.request(request_id="abandoned") as req:
            for i in range(100):
                await asyncio.sleep(0)
                req.token()
                yield i

    async def consume_one() -> None:
        agen = stream()
        await agen.__anext__()
        del agen  # never closed by its consumer

    asyncio.run(consume_one())
    gc.collect()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    # its OTel context is left in another context too: no "Failed to detach context" error
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert span.attributes[sc.REQUEST_ID] == "abandoned"
    assert span.attributes[sc.OUTPUT_TOKENS] == 1


# ---- decorators on streaming handlers --------------------------------------------


def test_traced_request_spans_an_async_streaming_handler(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    @tt.traced_request(model="tiny")
    async def stream(n: int) -> AsyncIterator[int]:
        req = tt.current_request()
        assert req is not None
        for i in range(n):
            await asyncio.sleep(0.01)
            req.token()
            got = yield i
            if got is not None:
                yield got * 10  # a value sent in comes back

    async def consume() -> list[int]:
        return [i async for i in stream(3)]

    async def send_in() -> int:
        agen = stream(3)
        await agen.__anext__()
        answer = await agen.asend(4)
        await agen.aclose()
        return answer

    assert asyncio.run(consume()) == [0, 1, 2]
    assert asyncio.run(send_in()) == 40
    full, closed = memory_sdk.spans(sc.SPAN_REQUEST)
    assert full.attributes[sc.OUTPUT_TOKENS] == 3
    assert full.end_time - full.start_time >= 30_000_000  # the whole iteration, not the call
    assert full.attributes[sc.REQUEST_MODEL] == "tiny"
    assert closed.attributes[sc.OUTPUT_TOKENS] == 1


def test_traced_request_and_phase_span_a_sync_generator(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    @tt.phase("detokenize")
    def detokenize(ids: list[int]) -> Iterator[str]:
        for i in ids:
            assert tt.current_request() is not None
            yield str(i)

    @tt.traced_request()
    def handler() -> Iterator[str]:
        req = tt.current_request()
        assert req is not None
        for text in detokenize([1, 2]):
            req.token()
            yield text

    assert list(handler()) == ["1", "2"]
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert span.attributes[sc.OUTPUT_TOKENS] == 2
    (phase,) = memory_sdk.spans(sc.SPAN_DETOKENIZE)
    assert phase.parent.span_id == span.context.span_id


def test_traced_sync_stream_that_starlette_runs_in_a_thread_pool(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """Starlette advances a sync stream in worker threads, each step in a copied context."""
    import httpx
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse
    from tt_testkit import ThreadServer

    app = FastAPI()

    @tt.traced_request(model="sync")
    def generate(n: int) -> Iterator[str]:
        for i in range(n):
            req = tt.current_request()
            assert req is not None  # the request is current in every step, not just the first
            req.token()
            yield f"tok{i}\n"

    @app.get("/v1/stream")
    def stream() -> StreamingResponse:
        return StreamingResponse(generate(3), media_type="text/plain")

    with ThreadServer(app) as server, httpx.Client() as client:
        with client.stream("GET", f"{server.url}/v1/stream") as resp:
            lines = [line for line in resp.iter_lines() if line]
    assert lines == ["tok0", "tok1", "tok2"]
    (span,) = memory_sdk.wait_for(sc.SPAN_REQUEST)
    assert span.attributes[sc.OUTPUT_TOKENS] == 3
    assert span.status.is_ok


# ---- configure / shutdown ------------------------------------------------------


def test_request_in_flight_across_configure_goes_to_the_new_configuration() -> None:
    first, second = InMemorySpanExporter(), InMemorySpanExporter()
    tt.configure(service_name="first", exporter=first)
    try:
        req = tt.request(request_id="across")
        tracing = tt.configure(service_name="second", exporter=second)
        req.token()
        req.finish()
        assert tracing.force_flush(5_000)
        (span,) = [s for s in second.get_finished_spans() if s.name == sc.SPAN_REQUEST]
        assert span.attributes[sc.REQUEST_ID] == "across"
        assert span.resource.attributes["service.name"] == "second"
    finally:
        tt.shutdown()


def test_use_after_shutdown_exports_nothing_and_says_so(caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING)
    exporter = InMemorySpanExporter()
    tt.configure(service_name="ended", exporter=exporter)
    in_flight = tt.request(request_id="in-flight")
    tt.shutdown()
    in_flight.finish()  # a request the server still finishes while it shuts down
    with tt.request(request_id="late") as req:
        req.token()
    tracing = tt.get_tracing()
    # no exporter to the default endpoint appeared: the ended configuration, disabled
    assert tracing.settings.disabled
    assert tracing.settings.service_name == "ended"
    assert tracing.provider._active_span_processor._span_processors == ()
    tracing.force_flush(1_000)
    assert exporter.get_finished_spans() == ()
    assert sum("used after tt.shutdown()" in m for m in _warnings(caplog)) == 1
    tt.shutdown()  # twice is fine
    # and configure() starts again
    again = InMemorySpanExporter()
    tt.configure(service_name="again", exporter=again)
    try:
        with tt.request(request_id="again"):
            pass
        assert tt.get_tracing().force_flush(5_000)
        assert [s.attributes[sc.REQUEST_ID] for s in again.get_finished_spans()] == ["again"]
    finally:
        tt.shutdown()


def test_environment_mistakes_do_not_fail_the_first_request(monkeypatch, caplog, unconfigured) -> None:  # type: ignore[no-untyped-def]
    """Without configure(), the first request configures from the environment: it must not raise."""
    caplog.set_level(logging.WARNING)
    monkeypatch.delenv("TOKENTRACE_ENDPOINT", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317")  # no scheme
    with tt.request() as req:
        req.token()
    with tt.request():
        pass
    assert tt.get_tracing().settings.disabled
    logged = _warnings(caplog)
    assert sum("not configured, nothing is exported: endpoint must be" in m for m in logged) == 1
    # an explicit configure() still says what is wrong
    with pytest.raises(ValueError, match="endpoint must be an http"):
        tt.configure()


def test_otel_protocol_http_json_from_the_environment_is_taken(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("TOKENTRACE_PROTOCOL", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")  # set for the host's others
    try:
        tracing = tt.configure(exporter=InMemorySpanExporter())
        assert tracing.settings.protocol == "http/protobuf"
    finally:
        tt.shutdown()


@pytest.mark.parametrize("record_content", [False, True])
def test_prompt_text_only_when_asked_for(record_content: bool) -> None:
    exporter = InMemorySpanExporter()
    tracing = tt.configure(exporter=exporter, record_content=record_content)
    try:
        with tt.request() as req:
            req.set_content(prompt="secret prompt", completion="secret answer")
        assert tracing.force_flush(5_000)
        (span,) = exporter.get_finished_spans()
        recorded = {k: span.attributes.get(k) for k in (sc.PROMPT_TEXT, sc.COMPLETION_TEXT)}
    finally:
        tt.shutdown()
    if record_content:
        assert recorded == {sc.PROMPT_TEXT: "secret prompt", sc.COMPLETION_TEXT: "secret answer"}
    else:
        assert recorded == {sc.PROMPT_TEXT: None, sc.COMPLETION_TEXT: None}


# ---- through a real server into a real `tokentrace serve` --------------------------


def test_streaming_handler_misused_reaches_serve(serve_sdk) -> None:  # type: ignore[no-untyped-def]
    """A FastAPI stream decorated with traced_request, a scheduler with int ids: stored whole."""
    import httpx
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse
    from tt_testkit import ThreadServer


    serve, tracing = serve_sdk
    tokens = 4
    app = FastAPI()

    @tt.traced_request(model="tiny", tenant="acme")
    async def generate(seq_no: int) -> AsyncIterator[str]:
        req = tt.current_request()
        assert req is not None
        batch = tt.TokenBatch([req])
        for i in range(tokens):
            with tt.engine_step(queue_depth="0", decode=[seq_no], tokens=batch):
                await asyncio.sleep(0.005)
            yield f"tok{i}\n"

    @app.get("/v1/stream/{seq_no}")
    async def stream(seq_no: int) -> StreamingResponse:
        return StreamingResponse(generate(seq_no), media_type="text/plain")

    with ThreadServer(app) as server, httpx.Client() as client:
        with client.stream("GET", f"{server.url}/v1/stream/7") as resp:
            lines = [line for line in resp.iter_lines() if line]
    assert len(lines) == tokens
    assert tracing.force_flush(10_000)
    serve.stop()
    rows = serve.rows("SELECT output_tokens, model, tenant, decode_ms FROM requests")
    assert rows
    row = rows[0]
    steps = serve.rows("SELECT request_ids, queue_depth FROM engine_steps")
    assert row[:3] == (tokens, "tiny", "acme")
    assert row[3] > 0
    assert steps == [(["7"], 0)] * tokens


def test_endpoint_copied_with_its_signal_path_still_reaches_serve(serve, caplog) -> None:  # type: ignore[no-untyped-def]
    """`…:4318/v1/traces`, as OTel's per-signal settings write it, became `…/v1/traces/v1/traces`
    (a 404 on every export): the signal path is read as the base URL's, and said so once."""
    caplog.set_level(logging.WARNING)
    tracing = tt.configure(endpoint=f"{serve.otlp_http}/v1/traces/", service_name="copied-endpoint")
    try:
        assert tracing.settings.endpoint == serve.otlp_http
        with tt.request(request_id="copied", model="tiny") as req:
            req.token()
        assert tracing.force_flush(10_000)
    finally:
        tt.shutdown()
    assert any("ends in a signal path" in m and "read as" in m for m in _warnings(caplog))
    serve.stop()
    assert serve.rows("SELECT request_id FROM requests WHERE service = 'copied-endpoint'") == [("copied",)]
