"""The integrations exercised as users use them, against the real packages: transformers
`generate` (streamers, batches, assisted decoding), a real fast tokenizer behind
`wrap_tokenizer`, openai 3 on httpx2 (raw responses, derived clients, retries, the
Responses API), and FastAPI (HTTP errors, mounts, root_path, websockets, disconnects)."""

from __future__ import annotations

import asyncio
import contextvars
import copy
import json
import logging
import pickle
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
from fastapi import FastAPI, HTTPException, Request, WebSocket
from fastapi.responses import JSONResponse, StreamingResponse
from tt_testkit import free_port

from tests.instrumentation._http_app import run_app
from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _safety
from tokentrace.instrumentation import semconv as sc

# ---------------------------------------------------------------- transformers

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")

VOCAB = ["[PAD]", "[UNK]", "[EOS]"] + [f"w{i}" for i in range(45)]
EOS = 2


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    """A real PreTrainedTokenizerFast built from code (WordLevel, no download), with a chat template."""
    wordlevel = tokenizers.Tokenizer(
        tokenizers.models.WordLevel(vocab={w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]")
    )
    wordlevel.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=wordlevel, pad_token="[PAD]", eos_token="[EOS]", unk_token="[UNK]"
    )
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return tok


def _gpt2() -> Any:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=len(VOCAB), n_positions=64,
        eos_token_id=EOS, bos_token_id=EOS, pad_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def _llama() -> Any:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(VOCAB), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        eos_token_id=EOS, bos_token_id=EOS, pad_token_id=0,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


class EosAt(transformers.LogitsProcessor):  # type: ignore[misc]
    """The user's processor: forces EOS once the sequence is `length` long (an early stop)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if input_ids.shape[1] >= self.length:
            scores[:, :] = -1e9
            scores[:, EOS] = 0
        return scores


@pytest.fixture
def generate_instrumented() -> Iterator[None]:
    tt.instrument_transformers_generate()
    yield
    tt.uninstrument_transformers_generate()


@pytest.fixture
def fresh_log_once(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> Any:
    """Every log_once site logs again in this test; gives caplog at WARNING for `tokentrace`."""
    monkeypatch.setattr(_safety, "_seen", set())
    caplog.set_level(logging.WARNING, logger="tokentrace")
    return caplog


def _phase_names(memory_sdk) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted(s.name for s in memory_sdk.spans() if s.name in (sc.SPAN_PREFILL, sc.SPAN_DECODE))


PROMPT = torch.tensor([[3, 4, 5]])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("label", "kwargs", "tokens"),
    [
        ("greedy, max_new_tokens reached", {"max_new_tokens": 5, "do_sample": False}, 5),
        ("sampling", {"max_new_tokens": 5, "do_sample": True}, 5),
        ("EOS early stop (the user's processor list)",
         {"max_new_tokens": 10, "do_sample": False, "logits_processor": [EosAt(6)]}, 4),
        ("return_dict_in_generate", {"max_new_tokens": 4, "do_sample": False,
                                     "return_dict_in_generate": True, "output_scores": True}, 4),
        ("beam search", {"max_new_tokens": 4, "num_beams": 2, "do_sample": False}, 4),
    ],
)  # fmt: skip
def test_generate_records_one_token_per_step(
    memory_sdk,
    generate_instrumented,
    fresh_log_once,
    label: str,
    kwargs: dict[str, Any],
    tokens: int,
) -> None:  # type: ignore[no-untyped-def]
    model = _gpt2()
    with tt.request() as req:
        out = model.generate(PROMPT, **kwargs)
    sequences = out.sequences if hasattr(out, "sequences") else out
    assert sequences.shape[-1] - PROMPT.shape[-1] == tokens == req.token_count, label
    assert _phase_names(memory_sdk) == [sc.SPAN_DECODE, sc.SPAN_PREFILL]
    # the wrapper ends the phase that is open: no misuse warning in the host's log
    assert "end_phase" not in fresh_log_once.text


@pytest.mark.slow
def test_generate_batch_records_steps_not_sequences(memory_sdk, generate_instrumented) -> None:  # type: ignore[no-untyped-def]
    """A batch of 2 in one request: one token time per step (both sequences' tokens at once)."""
    model = _llama()
    with tt.request() as req:
        out = model.generate(torch.tensor([[3, 4, 5], [6, 7, 8]]), max_new_tokens=4, min_new_tokens=4,
                             do_sample=False)  # fmt: skip
    assert out.shape == (2, 7) and req.token_count == 4


def test_generate_raising_passes_the_exception_through(
    memory_sdk, generate_instrumented, fresh_log_once
) -> None:  # type: ignore[no-untyped-def]
    class Broken(transformers.LogitsProcessor):  # type: ignore[misc]
        def __call__(self, input_ids: Any, scores: Any) -> Any:
            raise KeyError("the user's bug")

    model = _gpt2()
    for inside in (True, False):
        memory_sdk.exporter.clear()
        with pytest.raises(KeyError) as caught:
            if inside:
                with tt.request():
                    model.generate(PROMPT, max_new_tokens=3, logits_processor=[Broken()])
            else:
                model.generate(PROMPT, max_new_tokens=3, logits_processor=[Broken()])
        assert caught.value.args == ("the user's bug",)
        (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
        assert not span.status.is_ok
        assert _phase_names(memory_sdk) == [sc.SPAN_PREFILL]  # no token came out
    assert "end_phase" not in fresh_log_once.text


def test_generate_outside_a_request_gets_its_own(memory_sdk, generate_instrumented) -> None:  # type: ignore[no-untyped-def]
    _gpt2().generate(PROMPT, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert span.attributes[sc.OUTPUT_TOKENS] == 4
    assert len(sc.unpack_list(span.attributes[sc.TOKEN_OFFSETS_US])) == 4
    assert _phase_names(memory_sdk) == [sc.SPAN_DECODE, sc.SPAN_PREFILL]


@pytest.mark.parametrize("how", ["prompt_lookup", "assistant_model"])
def test_assisted_generation_counts_accepted_tokens(
    memory_sdk, generate_instrumented, fresh_log_once, how: str
) -> None:  # type: ignore[no-untyped-def]
    """Candidate-based decoding calls logits processors once per *draft* token (and the
    assistant's own generate): the count must be the tokens that came out, in one request."""
    model = _gpt2()
    prompt = torch.tensor([[3, 4, 5, 3, 4, 5, 3, 4]])
    extra: dict[str, Any] = (
        {"prompt_lookup_num_tokens": 3} if how == "prompt_lookup" else {"assistant_model": _gpt2()}
    )
    with tt.request() as req:
        out = model.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False, **extra)
    assert out.shape[-1] - prompt.shape[-1] == 8 == req.token_count
    assert len(memory_sdk.spans(sc.SPAN_REQUEST)) == 1  # the assistant's generate is part of ours
    assert _phase_names(memory_sdk) == [sc.SPAN_DECODE, sc.SPAN_PREFILL]
    assert "end_phase" not in fresh_log_once.text


def test_generate_with_streamers(memory_sdk, generate_instrumented, hf_tokenizer, capsys) -> None:  # type: ignore[no-untyped-def]
    model = _gpt2()
    tok = tt.wrap_tokenizer(hf_tokenizer)
    with tt.request() as req:
        ids = tok("w1 w2 w3", return_tensors="pt")["input_ids"]
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False,
                       streamer=transformers.TextStreamer(tok))  # fmt: skip
    assert req.token_count == 4 and capsys.readouterr().out.strip()

    # TextIteratorStreamer: generate runs in a thread, started with this context so
    # that the thread's generate lands in this request (a bare Thread: the next test)
    with tt.request() as req:
        streamer = transformers.TextIteratorStreamer(tok, skip_prompt=True)
        kwargs = {
            "inputs": ids,
            "max_new_tokens": 4,
            "min_new_tokens": 4,
            "do_sample": False,
            "streamer": streamer,
        }
        ctx = contextvars.copy_context()
        thread = threading.Thread(target=ctx.run, args=(model.generate,), kwargs=kwargs)
        thread.start()
        text = "".join(streamer)
        thread.join()
    assert text.strip() and req.token_count == 4
    assert len(memory_sdk.spans(sc.SPAN_REQUEST)) == 2


@pytest.mark.parametrize("streamer_type", ["TextIteratorStreamer", "AsyncTextIteratorStreamer"])
def test_generate_in_a_bare_thread_records_into_the_streamers_request(
    memory_sdk, generate_instrumented, hf_tokenizer, streamer_type: str
) -> None:  # type: ignore[no-untyped-def]
    """HF's usual streaming: `Thread(target=model.generate, kwargs={..., "streamer": s})`
    (or `run_in_executor`, which copies no context either): that thread has no current
    request, so the request current where the streamer was made is the one it serves."""
    model = _gpt2()
    ids = hf_tokenizer("w1 w2 w3", return_tensors="pt")["input_ids"]
    kwargs: dict[str, Any] = {"inputs": ids, "max_new_tokens": 4, "min_new_tokens": 4,
                              "do_sample": False}  # fmt: skip

    if streamer_type == "TextIteratorStreamer":
        with tt.request(request_id="served") as req:
            streamer = transformers.TextIteratorStreamer(hf_tokenizer, skip_prompt=True)
            thread = threading.Thread(
                target=model.generate, kwargs={**kwargs, "streamer": streamer}
            )
            thread.start()
            text = "".join(streamer)
            thread.join()
    else:

        async def serve() -> tuple[Any, str]:
            async with tt.request(request_id="served") as req:
                streamer = transformers.AsyncTextIteratorStreamer(hf_tokenizer, skip_prompt=True)
                loop = asyncio.get_running_loop()
                done = loop.run_in_executor(
                    None, lambda: model.generate(**kwargs, streamer=streamer)
                )
                text = "".join([t async for t in streamer])
                await done
            return req, text

        req, text = asyncio.run(serve())
    assert text.strip() and req.token_count == 4
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)  # the handler's: generate made none of its own
    assert span.attributes[sc.OUTPUT_TOKENS] == 4
    assert _phase_names(memory_sdk) == [sc.SPAN_DECODE, sc.SPAN_PREFILL]

    # a streamer whose request has ended serves nobody's: generate makes its own
    memory_sdk.exporter.clear()
    with tt.request(request_id="gone"):
        stale = transformers.TextStreamer(hf_tokenizer)
    model.generate(**kwargs, streamer=stale)
    spans = memory_sdk.spans(sc.SPAN_REQUEST)
    assert len(spans) == 2 and spans[-1].attributes[sc.OUTPUT_TOKENS] == 4


# ---------------------------------------------------------------- wrap_tokenizer


def test_wrapped_fast_tokenizer_behaves_as_the_tokenizer(memory_sdk, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    tok = tt.wrap_tokenizer(hf_tokenizer)
    # what users check and read pass through
    assert isinstance(tok, transformers.PreTrainedTokenizerBase)
    assert isinstance(tok, transformers.PreTrainedTokenizerFast)
    assert (tok.eos_token_id, len(tok), tok.vocab_size) == (EOS, len(VOCAB), len(VOCAB))
    messages = [{"role": "user", "content": "w1 w2"}]
    with tt.request() as req:
        batch = tok(["w1 w2", "w3"], padding=True, return_tensors="pt")
        chat_ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
        ids = tok.encode("w1 w2 w3")
        text = tok.decode(ids)
        texts = tok.batch_decode([[3, 4], [5]])
        phases = [name for name, _, _ in req._phases]
    assert batch["input_ids"].tolist() == [[4, 5], [6, 0]]
    assert list(chat_ids["input_ids"] if "input_ids" in chat_ids else chat_ids) == [4, 5]
    assert (text, texts) == ("w1 w2 w3", ["w0 w1", "w2"])
    # apply_chat_template is how a chat prompt becomes ids: timed as tokenize
    assert phases == ["tokenize"] * 3 + ["detokenize"] * 2


def test_wrapped_tokenizer_copies_and_pickles(memory_sdk, hf_tokenizer) -> None:  # type: ignore[no-untyped-def]
    """A DataLoader worker under spawn pickles the tokenizer, a Trainer deep-copies it."""
    tok = tt.wrap_tokenizer(hf_tokenizer)
    for copied in (copy.copy(tok), copy.deepcopy(tok), pickle.loads(pickle.dumps(tok))):
        assert isinstance(copied, transformers.PreTrainedTokenizerFast)
        with tt.request() as req:
            assert copied.encode("w1 w2") == [4, 5]
            assert [name for name, _, _ in req._phases] == ["tokenize"]
    with tt.request() as held:
        pass
    explicit = tt.wrap_tokenizer(hf_tokenizer, request=held)
    assert copy.deepcopy(explicit)._self_request is held  # a copy times into the same request


# ---------------------------------------------------------------- openai 3 / httpx2

openai = pytest.importorskip("openai")


def _fake_openai() -> FastAPI:
    """Enough of the OpenAI API: chat completions (plain, streamed, failing with the status
    the model name says: `fail429`) and the Responses API streamed."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        model = body["model"]
        if model.startswith("fail"):
            error = {"error": {"message": "no", "type": "x", "code": None}}
            return JSONResponse(error, status_code=int(model[4:]), headers={"retry-after-ms": "10"})
        if body.get("stream"):

            async def events() -> AsyncIterator[bytes]:
                for i in range(3):
                    await asyncio.sleep(0.005)
                    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": model,
                             "choices": [{"index": 0, "delta": {"content": f"t{i}"}, "finish_reason": None}]}  # fmt: skip
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        message = {"role": "assistant", "content": "hi"}
        return {"id": "c", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip

    @app.post("/v1/responses")
    async def responses(request: Request) -> StreamingResponse:
        body = await request.json()
        resp = {"id": "r", "object": "response", "created_at": 0, "model": body["model"], "output": [],
                "status": "in_progress", "parallel_tool_calls": False, "tool_choice": "auto", "tools": []}  # fmt: skip

        async def events() -> AsyncIterator[bytes]:
            created = {"type": "response.created", "sequence_number": 0, "response": resp}
            yield f"event: response.created\ndata: {json.dumps(created)}\n\n".encode()
            for i in range(3):
                await asyncio.sleep(0.005)
                delta = {"type": "response.output_text.delta", "sequence_number": i + 1, "item_id": "m",
                         "output_index": 0, "content_index": 0, "delta": f"t{i}", "logprobs": []}  # fmt: skip
                yield f"event: response.output_text.delta\ndata: {json.dumps(delta)}\n\n".encode()
            done = {
                "type": "response.completed",
                "sequence_number": 4,
                "response": dict(resp, status="completed"),
            }
            yield f"event: response.completed\ndata: {json.dumps(done)}\n\n".encode()

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def openai_url() -> Iterator[str]:
    with run_app(_fake_openai(), free_port()) as url:
        yield f"{url}/v1"


@pytest.fixture
def openai_instrumented() -> Iterator[None]:
    tt.instrument_openai()
    yield
    tt.uninstrument_openai()


MESSAGES = [{"role": "user", "content": "hi"}]


def _client_spans(memory_sdk) -> list[Any]:  # type: ignore[no-untyped-def]
    spans = memory_sdk.spans(sc.SPAN_CLIENT)
    memory_sdk.exporter.clear()
    return spans


def test_openai_raw_derived_and_responses_calls_are_traced(
    memory_sdk, openai_instrumented, openai_url
) -> None:  # type: ignore[no-untyped-def]
    # every client here is closed: one left to the garbage collector warns of its
    # unclosed socket in whichever test happens to collect it
    with openai.OpenAI(base_url=openai_url, api_key="none", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(model="tiny", messages=MESSAGES)
        assert raw.parse().choices[0].message.content == "hi"
        with client.chat.completions.with_streaming_response.create(
            model="tiny", messages=MESSAGES, stream=True
        ) as resp:
            assert [line for line in resp.iter_lines() if line][-1] == "data: [DONE]"
        # derived clients share the instrumented httpx2 client (closed with `client`)
        client.with_options(timeout=5).chat.completions.create(model="tiny", messages=MESSAGES)
        client.copy(max_retries=2).chat.completions.create(model="tiny", messages=MESSAGES)
        events = [e.type for e in client.responses.create(model="tiny", input="hi", stream=True)]
    assert events[0] == "response.created" and events[-1] == "response.completed"
    spans = _client_spans(memory_sdk)
    assert len(spans) == 5
    assert all(s.attributes[sc.REQUEST_MODEL] == "tiny" and s.status.is_ok for s in spans)
    assert [s.attributes.get(sc.CLIENT_CHUNKS, 0) > 0 for s in spans] == [
        False,
        True,
        False,
        False,
        True,
    ]

    async def call() -> None:
        aclient = openai.AsyncOpenAI(base_url=openai_url, api_key="none", max_retries=0)
        stream = await aclient.with_options(timeout=5).responses.create(
            model="tiny", input="hi", stream=True
        )
        assert [e.type async for e in stream][-1] == "response.completed"
        await aclient.close()

    asyncio.run(call())
    (span,) = _client_spans(memory_sdk)
    # response.created / .completed carry no output: a chunk per output_text.delta
    assert span.attributes[sc.CLIENT_CHUNKS] == 3


@pytest.mark.parametrize(
    ("status", "error"), [(429, "RateLimitError"), (500, "InternalServerError")]
)
def test_openai_error_status_one_error_span_per_attempt(
    memory_sdk, openai_instrumented, openai_url, status: int, error: str
) -> None:  # type: ignore[no-untyped-def]
    with openai.OpenAI(base_url=openai_url, api_key="none", max_retries=1) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model=f"fail{status}", messages=MESSAGES)
    assert type(caught.value).__name__ == error  # the SDK's own exception, unchanged
    spans = _client_spans(memory_sdk)
    assert len(spans) == 2  # the attempt and its retry, each its own CLIENT span
    for span in spans:
        assert span.attributes[sc.HTTP_STATUS] == status
        # OpenTelemetry HTTP semconv: a CLIENT span's 4xx is an error as well as its 5xx
        assert not span.status.is_ok and f"HTTP {status}" in span.status.description


def test_openai_client_closed_by_the_user(memory_sdk, openai_instrumented, openai_url) -> None:  # type: ignore[no-untyped-def]
    client = openai.OpenAI(base_url=openai_url, api_key="none", max_retries=0)
    client.close()
    with pytest.raises(RuntimeError, match="closed"):  # httpx2's error, unchanged
        client.chat.completions.create(model="tiny", messages=MESSAGES)
    (span,) = _client_spans(memory_sdk)
    assert not span.status.is_ok and sc.HTTP_STATUS not in span.attributes


@pytest.mark.slow
def test_openai_stream_dropped_unread_ends_its_span(
    memory_sdk, openai_instrumented, openai_url
) -> None:  # type: ignore[no-untyped-def]
    import gc

    # the client's pool still holds the dropped stream's connection: closing the
    # client closes its socket (else the collector of some later test warns of it)
    with openai.OpenAI(base_url=openai_url, api_key="none", max_retries=0) as client:
        stream = client.chat.completions.create(model="unread", messages=MESSAGES, stream=True)
        del stream  # never iterated, never closed
        gc.collect()
        (span,) = memory_sdk.wait_for(sc.SPAN_CLIENT)
    assert span.attributes[sc.REQUEST_MODEL] == "unread"
    assert span.attributes[sc.REQUEST_DISCONNECTED] is True and span.status.is_ok


# ---------------------------------------------------------------- FastAPI / Starlette


def _server_app() -> tuple[FastAPI, FastAPI, dict[str, Any]]:
    app, sub, seen = FastAPI(), FastAPI(), {}

    @app.get("/missing")
    async def missing() -> None:
        raise HTTPException(404, "no such thing")

    @app.get("/limited")
    async def limited() -> None:
        raise HTTPException(429, "slow down")

    @app.get("/crash")
    async def crash() -> None:
        raise RuntimeError("handler bug")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {}

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            try:
                for _ in range(200):
                    await asyncio.sleep(0.01)
                    yield b"data: x\n\n"
            except BaseException as exc:
                seen["stream_exit"] = type(exc).__name__
                raise

        return StreamingResponse(body(), media_type="text/event-stream")

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        seen["ws_request"] = tt.current_request()
        await websocket.send_text("echo " + await websocket.receive_text())
        await websocket.close()

    @sub.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, Any]:
        req = tt.current_request()
        return {"id": item_id, "traced": req is not None}

    app.mount("/sub", sub)
    return app, sub, seen


def _serve(app: FastAPI, **config: Any) -> AbstractContextManager[str]:
    """run_app on a free port with uvicorn settings (root_path), quiet."""
    return run_app(app, free_port(), **{"log_level": "critical", **config})


def _one_server_span(memory_sdk) -> Any:  # type: ignore[no-untyped-def]
    (span,) = memory_sdk.wait_for(sc.SPAN_REQUEST)
    memory_sdk.exporter.clear()
    return span


def test_fastapi_statuses_routes_and_passthrough(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    import httpx

    app, sub, seen = _server_app()
    tt.instrument_fastapi(app, exclude_paths=["/health"])
    tt.instrument_fastapi(sub)  # a sub-app instrumented as well: still one span per request
    with _serve(app) as url:
        for path, status in (("/missing", 404), ("/limited", 429)):
            assert httpx.get(url + path).status_code == status
            span = _one_server_span(memory_sdk)
            # a 4xx is the client's: recorded, span status unset (OTel HTTP server semconv)
            assert span.attributes[sc.HTTP_STATUS] == status and span.status.is_ok
        assert httpx.get(url + "/crash").status_code == 500
        span = _one_server_span(memory_sdk)
        # the 500 is sent by Starlette's outermost middleware, after ours saw the exception
        assert span.attributes[sc.HTTP_STATUS] == 500 and not span.status.is_ok
        assert httpx.get(url + "/sub/items/3").json() == {"id": 3, "traced": True}
        span = _one_server_span(memory_sdk)
        assert span.attributes[sc.ROUTE] == "/sub/items/{item_id}"  # the mount's prefix kept

        # the client goes away mid-stream: the span still ends, with what was sent
        with httpx.stream("GET", url + "/stream") as resp:
            stream = resp.iter_bytes()
            next(stream)
        span = _one_server_span(memory_sdk)
        assert span.attributes[sc.HTTP_STATUS] == 200 and span.attributes[sc.ROUTE] == "/stream"
    assert seen["stream_exit"] in ("CancelledError", "GeneratorExit")

    from starlette.testclient import TestClient

    with TestClient(app).websocket_connect("/ws") as ws:
        ws.send_text("hi")
        assert ws.receive_text() == "echo hi"
    assert seen["ws_request"] is None and not memory_sdk.spans(sc.SPAN_REQUEST)


def test_fastapi_behind_a_root_path(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    """uvicorn --root-path (a proxy strips the prefix): scope `path` carries the prefix."""
    import httpx

    app, _, _ = _server_app()
    tt.instrument_fastapi(app, exclude_paths=["/health"])
    with _serve(app, root_path="/api") as url:
        assert httpx.get(url + "/health").status_code == 200  # excluded as the app names it
        assert httpx.get(url + "/missing").status_code == 404
        span = _one_server_span(memory_sdk)
        assert span.attributes[sc.ROUTE] == "/missing"
        assert span.attributes[sc.URL_PATH] == "/api/missing"
        assert httpx.get(url + "/sub/items/4").json()["id"] == 4
        assert _one_server_span(memory_sdk).attributes[sc.ROUTE] == "/sub/items/{item_id}"
