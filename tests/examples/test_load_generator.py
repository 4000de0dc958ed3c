from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")

from tt_testkit import start_serve  # noqa: E402

from tokentrace.examples.load.generator import LoadGenerator, PromptBuilder, summarize  # noqa: E402
from tokentrace.examples.load.workloads import RequestSpec  # noqa: E402
from tokentrace.examples.netproxy import start_proxy  # noqa: E402
from tokentrace.examples.tiny_llm.config import ServerConfig  # noqa: E402
from tokentrace.examples.tiny_llm.server import ServerHandle, create_app, serve_in_thread  # noqa: E402

SMALL = ServerConfig(
    d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=512, max_batch_size=4, threads=2
)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    with serve_in_thread(create_app(SMALL)) as handle:
        yield handle


def test_prompt_builder_hits_the_token_count() -> None:
    builder = PromptBuilder()
    for tokens in (1, 37, 300):
        assert abs(len(builder.tokenizer.encode(builder.build(tokens))) - tokens) <= 2
    assert builder.build(20) != builder.build(20)


def test_open_loop_replay_through_a_delaying_proxy(server: ServerHandle) -> None:
    specs = [
        RequestSpec(
            arrival_s=0.05 * i, prompt_tokens=20 + 30 * i, output_tokens=4, tenant=f"t{i % 2}"
        )
        for i in range(5)
    ]
    seen: list[httpx.Request] = []

    async def on_request(request: httpx.Request) -> None:
        seen.append(request)

    async def main() -> list:  # type: ignore[type-arg]
        # The injected client is what an instrumented client wrapper replaces.
        async with httpx.AsyncClient(timeout=30, event_hooks={"request": [on_request]}) as client:
            return await LoadGenerator(proxy.url, client=client).run(specs)

    with start_proxy(0, server.port, delay_ms=25) as proxy:
        results = asyncio.run(main())
    assert len(seen) == 5 and seen[0].headers["x-tenant"] == "t0"
    assert all(r.ok for r in results), [r.error for r in results]
    for result, spec in zip(results, specs, strict=True):
        assert result.spec is spec
        assert result.completion_tokens == 4 and len(result.chunk_times) == 4
        assert result.ttft_s is not None and result.ttft_s >= 0.050  # both proxy directions
        assert result.start <= result.first_chunk <= result.end  # type: ignore[operator]
    summary = summarize(results)
    assert summary["ok"] == 5 and summary["ttft_ms"]["p50"] >= 50


def test_closed_loop_and_non_streaming(server: ServerHandle) -> None:
    specs = [RequestSpec(arrival_s=0.0, prompt_tokens=10, output_tokens=3) for _ in range(6)]
    generator = LoadGenerator(
        server.url, stream=False, client_factory=lambda: httpx.AsyncClient(timeout=30)
    )
    results = asyncio.run(generator.run(specs, concurrency=2))
    assert [r.completion_tokens for r in results] == [3] * 6
    assert all(r.ok and r.text for r in results)


def test_errors_are_recorded_not_raised(server: ServerHandle) -> None:
    spec = RequestSpec(arrival_s=0.0, prompt_tokens=10, output_tokens=3, traffic_class="bulk")
    results = asyncio.run(LoadGenerator(server.url).run([spec]))
    assert results[0].status == 400 and not results[0].ok
    with pytest.raises(ValueError):
        LoadGenerator(server.url, client=httpx.AsyncClient(), client_factory=httpx.AsyncClient)


@pytest.mark.slow
def test_command_line_traces_its_requests_with_otlp_endpoint(
    server: ServerHandle, tmp_path: Path
) -> None:
    # examples/README's "Run it yourself": without client spans the network bucket
    # is never measured, so the command line must be able to trace its requests.
    serve = start_serve(tmp_path, "--baseline", "1")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tokentrace.examples.load.generator", "--url", server.url,
             "--limit", "3", "--time-compression", "1000", "--max-output-tokens", "3",
             "--otlp-endpoint", serve.otlp_http, "--service-name", "load-test"],
            cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    finally:
        serve.stop()
    rows = serve.rows("select source, service from requests")
    assert rows and all(row == ("genai_client", "load-test") for row in rows), rows
