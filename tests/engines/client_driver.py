"""Runs one scenario's OpenAI client calls, traced by a real third-party instrumentation.

Run with the engine venv's interpreter:

    .venv-engines/bin/python client_driver.py SCENARIO --base-url URL --otlp URL --out FILE

The OpenAI client is instrumented by the scenario's instrumentation (OpenLLMetry,
OpenInference or openai-v2) and by httpx's, so the traceparent reaches the server; its spans
go over OTLP/HTTP to `--otlp`.  The client measures each request itself (TTFT at the first
chunk with text, E2E at the stream's end, every chunk's arrival) and writes those beside the
recording: the ground truth tokentrace's numbers are checked against.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scenarios import BY_NAME, OPENAI_V2, OPENINFERENCE, OPENLLMETRY, SERVED_MODEL

CORPUS = Path(__file__).resolve().parents[2] / "examples" / "data" / "corpus"
SHORT_PROMPTS = (
    "Tell me about the weather by the sea.",
    "What is a good name for a small cat?",
    "Summarize the last meeting in two lines.",
    "Why is the sky blue in the afternoon?",
    "Write a short note to a friend.",
    "How far is the moon from here?",
)


@dataclass
class Measured:
    """What the client saw of one request, on its own clock."""

    key: str  # sent as X-Request-Id: vLLM's request id is built from it
    kind: str  # chat | completion
    stream: bool
    start_unix_ns: int
    trace_id: str = ""  # of the httpx span that carried the request
    status: str = "ok"  # ok | aborted | http_<code>
    ttft_ms: float | None = None  # first chunk that carries text
    first_chunk_ms: float | None = None  # first chunk of any kind (a role-only one too)
    e2e_ms: float | None = None
    chunk_ms: list[float] = field(default_factory=list)  # each chunk's arrival since start
    n: int = 1
    prompts: int = 1
    tenant: str = ""
    traffic_class: str = ""
    max_tokens: int = 0


def _text_of(chunk: Any) -> str:
    for choice in getattr(chunk, "choices", None) or []:
        delta = getattr(choice, "delta", None)
        text = getattr(delta, "content", None) if delta is not None else None
        text = text if text is not None else getattr(choice, "text", None)
        if text:
            return str(text)
    return ""


def long_prompt(index: int, chars: int = 4600) -> str:
    """Gives a long prompt (~1,500 tokens) that shares no prefix with another index's, so
    vLLM's prefix cache cannot skip its prefill."""
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(CORPUS.glob("*.txt")))
    start = (index * 3163) % len(text)
    return f"[{index}] " + (text * 2)[start : start + chars]


class Client:
    """The instrumented AsyncOpenAI client and the per-request measurements."""

    def __init__(self, base_url: str, model: str) -> None:
        import openai

        self.openai = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
        self.model = model
        self.measured: list[Measured] = []
        self.trace_ids: dict[str, str] = {}
        self._serial = 0

    def key(self, label: str) -> str:
        self._serial += 1
        return f"{label}-{self._serial:03d}"

    async def chat(
        self,
        label: str,
        prompt: str,
        max_tokens: int,
        stream: bool = True,
        abort_after: int | None = None,
        model: str | None = None,
        n: int = 1,
        **meta: str,
    ) -> Measured:
        """Sends one chat completion; gives (and keeps) what the client measured."""
        m = Measured(self.key(label), "chat", stream, time.time_ns(), n=n, max_tokens=max_tokens)
        m.tenant = meta.get("tenant", "")
        m.traffic_class = meta.get("traffic_class", "")
        call = self.openai.chat.completions.create(
            model=model or self.model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            stream=stream,
            n=n,
            extra_headers={"X-Request-Id": m.key},
            extra_body={"ignore_eos": True},
        )
        await self._measure(m, call, abort_after)
        return m

    async def completion(
        self, label: str, prompts: list[str] | str, max_tokens: int, stream: bool = False
    ) -> Measured:
        """Sends one text completion (one prompt or several); gives what the client measured."""
        m = Measured(self.key(label), "completion", stream, time.time_ns(), max_tokens=max_tokens)
        m.prompts = len(prompts) if isinstance(prompts, list) else 1
        call = self.openai.completions.create(
            model=self.model,
            prompt=prompts,
            max_tokens=max_tokens,
            stream=stream,
            extra_headers={"X-Request-Id": m.key},
            extra_body={"ignore_eos": True},
        )
        await self._measure(m, call, None)
        return m

    async def _measure(self, m: Measured, call: Any, abort_after: int | None) -> None:
        import openai

        self.measured.append(m)
        t0 = time.perf_counter()
        try:
            result = await call
            if not m.stream:
                m.e2e_ms = (time.perf_counter() - t0) * 1e3
                return
            async for chunk in result:
                at = (time.perf_counter() - t0) * 1e3
                m.chunk_ms.append(round(at, 3))
                if m.first_chunk_ms is None:
                    m.first_chunk_ms = at
                if m.ttft_ms is None and _text_of(chunk):
                    m.ttft_ms = at
                if abort_after is not None and len(m.chunk_ms) >= abort_after:
                    m.status = "aborted"
                    await result.close()  # the connection goes: vLLM aborts the request
                    break
            m.e2e_ms = (time.perf_counter() - t0) * 1e3
        except openai.APIStatusError as exc:
            m.status = f"http_{exc.status_code}"
            m.e2e_ms = (time.perf_counter() - t0) * 1e3
        finally:
            m.trace_id = self.trace_ids.get(m.key, "")


def setup_tracing(instrumentation: str, otlp: str, service: str, client: Client) -> Any:
    """Instruments OpenAI and httpx, exporting to `otlp`; gives the tracer provider."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=f"{otlp}/v1/traces"), schedule_delay_millis=200
        )
    )
    trace.set_tracer_provider(provider)

    async def on_request(span: Any, request: Any) -> None:
        key = request.headers.get("x-request-id")
        if key:
            client.trace_ids[key] = format(span.get_span_context().trace_id, "032x")

    HTTPXClientInstrumentor().instrument(tracer_provider=provider, async_request_hook=on_request)
    if instrumentation == OPENLLMETRY:
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor as Instrumentor
    elif instrumentation == OPENINFERENCE:
        from openinference.instrumentation.openai import OpenAIInstrumentor as Instrumentor
    elif instrumentation == OPENAI_V2:
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor as Instrumentor
    else:
        raise ValueError(f"unknown instrumentation {instrumentation!r}")
    Instrumentor().instrument(tracer_provider=provider)
    return provider


# ---- the scenarios: each a short real run ----------------------------------------------


async def healthy_chats(c: Client, count: int = 12, concurrency: int = 3) -> None:
    """Chat streams, `concurrency` at a time, 24 tokens each."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            await c.chat("chat", SHORT_PROMPTS[i % len(SHORT_PROMPTS)], max_tokens=24)

    await asyncio.gather(*(one(i) for i in range(count)))


async def stutter(c: Client) -> None:
    """24 chat streams of 64 tokens, four at a time; meanwhile a long prompt (one whole
    prefill step each) arrives every ~0.3 s."""
    gate = asyncio.Semaphore(4)

    async def stream(i: int) -> None:
        async with gate:
            await c.chat("stream", SHORT_PROMPTS[i % len(SHORT_PROMPTS)], max_tokens=64)

    async def long_prompts() -> None:
        for i in range(8):
            await asyncio.sleep(0.15)
            await c.chat("long", long_prompt(i), max_tokens=2)

    await asyncio.gather(*(stream(i) for i in range(24)), long_prompts())


async def tenants(c: Client, tracer: Any) -> None:
    """Two small tenants' chats, alone and then beside a big tenant's burst of long prompts."""

    async def handle(tenant: str, prompt: str, max_tokens: int) -> None:
        # the application's own span: where application code puts who is asking
        with tracer.start_as_current_span("handle_request", attributes={"tenant.id": tenant}):
            await c.chat("tenant", prompt, max_tokens=max_tokens, tenant=tenant)

    small = ("acme-small", "beta-small")
    for i in range(8):  # alone: what a small tenant's chat takes on an idle server
        await handle(small[i % 2], SHORT_PROMPTS[i % len(SHORT_PROMPTS)], 16)

    async def alongside(i: int) -> None:
        await asyncio.sleep(0.05 * i)
        await handle(small[i % 2], SHORT_PROMPTS[i % len(SHORT_PROMPTS)], 16)

    burst = [handle("bigcorp", long_prompt(10 + i, 2400), 48) for i in range(12)]
    await asyncio.gather(*burst, *(alongside(i) for i in range(12)))


async def batch_events(c: Client, tracer: Any) -> None:
    """A batch job's four 160-token streams beside live chats, each under an application
    span that names its traffic class."""

    async def job(i: int) -> None:
        with tracer.start_as_current_span(
            "batch_job", attributes={"tokentrace.traffic_class": "batch", "tenant.id": "nightly"}
        ):
            await c.chat("batch", SHORT_PROMPTS[i], max_tokens=160, traffic_class="batch")

    async def live(i: int, delay_s: float = 0.0) -> None:
        await asyncio.sleep(delay_s)
        with tracer.start_as_current_span(
            "handle_request", attributes={"tokentrace.traffic_class": "interactive"}
        ):
            prompt = SHORT_PROMPTS[i % len(SHORT_PROMPTS)]
            await c.chat("live", prompt, max_tokens=16, traffic_class="interactive")

    for i in range(10):  # alone
        await live(i)
    await asyncio.gather(*(job(i) for i in range(4)), *(live(i, 0.04 * i) for i in range(16)))


async def client_errors(c: Client) -> None:
    """Good requests, aborted streams, a 400 and a 404: the last three never reach vLLM's
    engine output (no `llm_request` span)."""
    await c.chat("ok", SHORT_PROMPTS[0], max_tokens=16)
    await c.chat("abort", SHORT_PROMPTS[1], max_tokens=200, abort_after=3)
    await c.chat("too-long", SHORT_PROMPTS[2], max_tokens=100_000)  # past --max-model-len: 400
    await c.chat("no-model", SHORT_PROMPTS[3], max_tokens=16, model="no-such-model")  # 404
    await c.chat("abort", SHORT_PROMPTS[4], max_tokens=200, abort_after=5)
    await c.chat("ok", SHORT_PROMPTS[5], max_tokens=16)


async def fanout(c: Client) -> None:
    """One chat stream with n=2, one completion call with 3 prompts."""
    await c.chat("n2", SHORT_PROMPTS[0], max_tokens=16, n=2)
    await c.completion("three", list(SHORT_PROMPTS[1:4]), max_tokens=12)


async def tiny_llm_completions(c: Client) -> None:
    """Completion streams against the example server, two at a time."""
    gate = asyncio.Semaphore(2)

    async def one(i: int) -> None:
        async with gate:
            await c.completion("tiny", SHORT_PROMPTS[i], max_tokens=16, stream=True)

    await asyncio.gather(*(one(i) for i in range(6)))


async def run(name: str, c: Client, tracer: Any) -> None:
    if name.startswith("chat_"):
        await healthy_chats(c)
    elif name == "stutter":
        await stutter(c)
    elif name == "tenants":
        await tenants(c, tracer)
    elif name == "batch_events":
        await batch_events(c, tracer)
    elif name == "client_errors":
        await client_errors(c)
    elif name == "fanout":
        await fanout(c)
    elif name == "tiny_llm_openinference":
        await tiny_llm_completions(c)
    else:
        raise ValueError(f"no client run for scenario {name!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=sorted(BY_NAME))
    parser.add_argument("--base-url", required=True, help="the server's OpenAI API, .../v1")
    parser.add_argument("--otlp", required=True, help="OTLP/HTTP endpoint for the client's spans")
    parser.add_argument("--out", type=Path, required=True, help="the client's measurements")
    parser.add_argument("--model", default=SERVED_MODEL)
    args = parser.parse_args()
    scenario = BY_NAME[args.scenario]
    if scenario.instrumentation is None:
        raise SystemExit(f"{scenario.name} has no client run")
    client = Client(args.base_url, args.model)
    provider = setup_tracing(
        scenario.instrumentation, args.otlp, f"chat-app-{scenario.instrumentation}", client
    )
    started = time.monotonic()
    try:
        asyncio.run(run(scenario.name, client, provider.get_tracer("chat-app")))
    finally:
        provider.shutdown()  # flushes every span before the file is written
    out = {
        "scenario": scenario.name,
        "instrumentation": scenario.instrumentation,
        "server": scenario.server,
        "seconds": round(time.monotonic() - started, 3),
        "requests": [asdict(m) for m in client.measured],
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
