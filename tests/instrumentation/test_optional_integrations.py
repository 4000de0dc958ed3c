"""openai and transformers integrations: run only where those packages are installed."""

from __future__ import annotations

import pytest
from tt_testkit import free_port

from tests.instrumentation._http_app import run_app
from tokentrace import instrumentation as tt
from tokentrace.instrumentation import semconv as sc


def test_openai_client_calls_get_client_spans(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    openai = pytest.importorskip("openai")
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/v1/completions")
    async def completions() -> dict[str, object]:
        return {
            "id": "c1",
            "object": "text_completion",
            "created": 0,
            "model": "tiny",
            "choices": [],
        }

    tt.instrument_openai()
    try:
        with run_app(tt.instrument_fastapi(app), free_port()) as url:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
            client.completions.create(model="tiny", prompt="hi")
    finally:
        tt.uninstrument_openai()
    client_span = memory_sdk.spans(sc.SPAN_CLIENT)[0]
    server = memory_sdk.spans(sc.SPAN_REQUEST)[0]
    assert client_span.attributes[sc.REQUEST_MODEL] == "tiny"
    assert server.parent.span_id == client_span.context.span_id


def test_transformers_generate_records_token_times(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=64)
    model = transformers.GPT2LMHeadModel(config)
    tt.instrument_transformers_generate()
    try:
        with tt.request() as req:
            model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=5, min_new_tokens=5, do_sample=False,
                           pad_token_id=0)  # fmt: skip
    finally:
        tt.uninstrument_transformers_generate()
    assert req.token_count == 5
    assert memory_sdk.spans(sc.SPAN_PREFILL) and memory_sdk.spans(sc.SPAN_DECODE)
