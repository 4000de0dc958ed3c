from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from tokentrace.examples.tiny_llm.config import ServerConfig  # noqa: E402
from tokentrace.examples.tiny_llm.server import ServerHandle, create_app, serve_in_thread  # noqa: E402

SMALL = ServerConfig(
    d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=512, max_batch_size=4, threads=2
)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    with serve_in_thread(create_app(SMALL)) as handle:
        yield handle


def _sse_payloads(response: httpx.Response) -> list[str]:
    payloads = []
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        payloads.append(line[len("data: ") :])
    return payloads


def test_streams_openai_completion_chunks(server: ServerHandle) -> None:
    body = {
        "model": "tiny",
        "prompt": "The river rises every spring",
        "max_tokens": 6,
        "stream": True,
    }
    headers = {"x-tenant": "acme", "x-traffic-class": "batch"}
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json=body, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = _sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert len(chunks) == 6
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["model"] == "tiny"
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]
    assert "".join(c["choices"][0]["text"] for c in chunks).strip()


def test_stream_usage_chunk_when_asked(server: ServerHandle) -> None:
    body = {
        "prompt": "Hello",
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=30) as response:
        payloads = _sse_payloads(response)
    usage = json.loads(payloads[-2])["usage"]
    assert usage["completion_tokens"] == 3 and usage["total_tokens"] == usage["prompt_tokens"] + 3


def test_non_streaming_completion(server: ServerHandle) -> None:
    response = httpx.post(
        f"{server.url}/v1/completions",
        json={"prompt": "Call me Ishmael.", "max_tokens": 4},
        timeout=30,
    )
    assert response.status_code == 200
    data = response.json()
    assert data["object"] == "text_completion"
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 4


def test_client_disconnect_frees_the_sequence(
    server: ServerHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = server.app.state.engine
    decoded: list[str] = []
    cancelled = threading.Event()
    cancel = engine.scheduler.cancel

    def cancel_seen(request_id: str) -> None:
        cancel(request_id)
        if request_id == "walks-away":
            cancelled.set()

    monkeypatch.setattr(engine.scheduler, "cancel", cancel_seen)

    def on_step(stats: Any) -> None:
        decoded.extend(stats.decode_request_ids)
        if "walks-away" in stats.decode_request_ids:
            # the scheduler waits here until the server has cancelled the request: its 480
            # tokens take ~0.3 s, less than a loaded machine may take to see the client go
            cancelled.wait(60)

    engine.add_step_hook(on_step)
    body = {"prompt": "A long answer please", "max_tokens": 480, "stream": True}
    headers = {"x-request-id": "walks-away"}
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json=body, headers=headers, timeout=30
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
    assert cancelled.wait(60), "the server did not cancel the request of a client that left"
    deadline = time.monotonic() + 30
    health = {}
    while time.monotonic() < deadline:
        health = httpx.get(f"{server.url}/health", timeout=5).json()
        if health["running"] == 0:
            break
        time.sleep(0.05)
    assert health["running"] == 0 and health["kv_usage"] == 0.0
    assert decoded.count("walks-away") < 479  # cancelled, not run to the end


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        ({"prompt": "hi", "max_tokens": 2}, {"x-traffic-class": "bulk"}),
        ({"prompt": "word " * 2000, "max_tokens": 2}, {}),
        ({"prompt": ["a", "b"], "max_tokens": 2}, {}),
    ],
)
def test_bad_requests_get_400(server: ServerHandle, body: dict, headers: dict) -> None:  # type: ignore[type-arg]
    response = httpx.post(f"{server.url}/v1/completions", json=body, headers=headers, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["message"]


def test_health(server: ServerHandle) -> None:
    health = httpx.get(f"{server.url}/health", timeout=5).json()
    assert health["status"] == "ok" and health["device"] == "cpu"


def test_stopped_engine_refuses_before_streaming() -> None:
    app = create_app(SMALL)
    with serve_in_thread(app) as handle:
        app.state.engine.stop()
        body = {"prompt": "hello", "max_tokens": 3, "stream": True}
        response = httpx.post(f"{handle.url}/v1/completions", json=body, timeout=30)
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "server_error"


def test_a_request_without_tenant_names_none() -> None:
    """A request that names no tenant (no x-tenant header, no `user`) is recorded with no
    tenant: a made-up "default" tenant read as the demo's biggest customer in reports."""
    from starlette.requests import Request

    from tokentrace.examples.tiny_llm.server import CompletionHandler, CompletionRequest

    handler = CompletionHandler(engine=None)  # type: ignore[arg-type]  # context() reads headers only

    def context(headers: dict[str, str], **body: object):  # type: ignore[no-untyped-def]
        raw = [(k.encode(), v.encode()) for k, v in headers.items()]
        return handler.context(
            Request({"type": "http", "headers": raw}), CompletionRequest(prompt="hi", **body)
        )

    assert context({}).tenant is None
    assert context({"x-tenant": "acme"}).tenant == "acme"
    assert context({}, user="u-7").tenant == "u-7"
