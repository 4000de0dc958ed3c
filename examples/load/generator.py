"""Async load generator: replays `RequestSpec`s against /v1/completions with streaming httpx.

Client-side times (perf_counter on this process) are kept per request: start,
first chunk, every chunk, end. The HTTP client is injectable (`client=` or
`client_factory=`), so an instrumented client can be plugged in unchanged.

CLI: python -m tokentrace.examples.load.generator --url http://127.0.0.1:8000 --trace azure_conv --limit 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from .workloads import (
    DEFAULT_SCALING,
    RequestSpec,
    Scaling,
    available_traces,
    load_workload,
    with_poisson_arrivals,
)

ClientFactory = Callable[[], httpx.AsyncClient]
DEFAULT_LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=200)


@dataclass
class RequestResult:
    """What the client saw for one request; times are perf_counter() seconds on this process."""

    spec: RequestSpec
    request_id: str
    scheduled_at: float  # when the request was due
    start: float  # when it was sent
    first_chunk: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    end: float = 0.0
    status: int | None = None
    completion_tokens: int = 0
    text: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_chunk is None else self.first_chunk - self.start

    @property
    def e2e_s(self) -> float:
        return self.end - self.start

    @property
    def send_lag_s(self) -> float:
        """How late the generator itself sent the request (it should stay near 0)."""
        return self.start - self.scheduled_at

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]


class PromptBuilder:
    """Builds prompts of a requested token length from the shipped corpus."""

    def __init__(self, tokenizer: Any | None = None) -> None:
        from tokentrace.examples.tiny_llm.tokenizer import build_tokenizer, read_corpus

        self.tokenizer = tokenizer or build_tokenizer()
        self._ids = self.tokenizer.encode(read_corpus())
        self._offset = 0

    def build(self, tokens: int) -> str:
        """Return text of about `tokens` tokens, each prompt cut from a new place in the corpus."""
        tokens = max(1, tokens)
        ids = self._ids
        start = self._offset % len(ids)
        self._offset += 997  # a prime stride: prompts differ and do not share prefixes
        piece = (ids[start:] + ids * (1 + tokens // len(ids)))[:tokens]
        return self.tokenizer.decode(piece)


class LoadGenerator:
    """Sends specs to `base_url` open-loop (at their arrival times) or closed-loop (N in flight)."""

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.AsyncClient | None = None,
        client_factory: ClientFactory | None = None,
        prompt_builder: PromptBuilder | None = None,
        model: str = "tiny-llm",
        stream: bool = True,
        timeout_s: float = 300.0,
        clock: Callable[[], float] = time.perf_counter,
        traced: bool = False,
    ) -> None:
        if client is not None and client_factory is not None:
            raise ValueError("pass either client or client_factory, not both")
        self.base_url = base_url.rstrip("/")
        self._client = client
        self._client_factory = client_factory or self._default_client
        self.prompts = prompt_builder or PromptBuilder()
        self.model = model
        self.stream = stream
        self.timeout_s = timeout_s
        self.clock = clock
        # True: each request is a tokentrace client span (call tt.configure first), so the
        # user-side TTFT/ITL and the network time between here and the server are measured.
        self.traced = traced

    def _default_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self.timeout_s, limits=DEFAULT_LIMITS)

    async def run(
        self, specs: Sequence[RequestSpec], *, concurrency: int | None = None
    ) -> list[RequestResult]:
        """Return one result per spec, in spec order.

        concurrency=None replays arrival times (open loop: requests pile up when
        the server is slow, as with real users); concurrency=N keeps N requests
        in flight and ignores arrival times (closed loop).
        """
        owns_client = self._client is None
        client = self._client or self._client_factory()
        try:
            if concurrency is None:
                return await self._open_loop(client, specs)
            return await self._closed_loop(client, specs, concurrency)
        finally:
            if owns_client:
                await client.aclose()

    async def _open_loop(
        self, client: httpx.AsyncClient, specs: Sequence[RequestSpec]
    ) -> list[RequestResult]:
        t0 = self.clock()

        async def at_arrival(spec: RequestSpec) -> RequestResult:
            due = t0 + spec.arrival_s
            delay = due - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            return await self.send(client, spec, scheduled_at=due)

        return list(await asyncio.gather(*(at_arrival(s) for s in specs)))

    async def _closed_loop(
        self, client: httpx.AsyncClient, specs: Sequence[RequestSpec], concurrency: int
    ) -> list[RequestResult]:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        results: list[RequestResult | None] = [None] * len(specs)
        next_index = iter(range(len(specs)))

        async def worker() -> None:
            for i in next_index:
                results[i] = await self.send(client, specs[i], scheduled_at=self.clock())

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(specs)))))
        return [r for r in results if r is not None]

    def request_body(self, spec: RequestSpec) -> dict[str, Any]:
        return {
            "model": self.model,
            "prompt": self.prompts.build(spec.prompt_tokens),
            "max_tokens": spec.output_tokens,
            "stream": self.stream,
        }

    async def send(
        self, client: httpx.AsyncClient, spec: RequestSpec, *, scheduled_at: float
    ) -> RequestResult:
        """Send one request and return what the client saw; never raises for HTTP or network errors."""
        request_id = f"load-{uuid.uuid4().hex[:16]}"
        headers = {
            "x-tenant": spec.tenant,
            "x-traffic-class": spec.traffic_class,
            "x-request-id": request_id,
        }
        body = self.request_body(spec)
        result = RequestResult(
            spec=spec, request_id=request_id, scheduled_at=scheduled_at, start=self.clock()
        )
        url = f"{self.base_url}/v1/completions"
        if self.traced:
            from tokentrace import instrumentation as tt

            async with tt.client_request(
                model=self.model, tenant=spec.tenant, traffic_class=spec.traffic_class
            ) as call:
                await self._send(client, url, body, call.headers(headers), result, call)
                call.set_tokens(prompt=spec.prompt_tokens, output=result.completion_tokens)
                if result.error is not None:
                    call.record_error(RuntimeError(result.error))
        else:
            await self._send(client, url, body, headers, result, None)
        result.end = self.clock()
        return result

    async def _send(
        self,
        client: httpx.AsyncClient,
        url: str,
        body: dict[str, Any],
        headers: dict[str, str],
        result: RequestResult,
        call: Any,
    ) -> None:
        try:
            if self.stream:
                await self._send_streaming(client, url, body, headers, result, call)
            else:
                response = await client.post(url, json=body, headers=headers)
                result.status = response.status_code
                self._record_chunk(result, self.clock(), call)
                self._read_body(result, response)
        except (httpx.HTTPError, OSError, ValueError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"

    async def _send_streaming(
        self,
        client: httpx.AsyncClient,
        url: str,
        body: dict[str, Any],
        headers: dict[str, str],
        result: RequestResult,
        call: Any = None,
    ) -> None:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            result.status = response.status_code
            if response.status_code != 200:
                await response.aread()
                result.error = f"HTTP {response.status_code}: {response.text[:200]}"
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                now = self.clock()
                chunk = json.loads(payload)
                if "error" in chunk:
                    result.error = str(chunk["error"].get("message"))
                    break
                for choice in chunk.get("choices", []):
                    self._record_chunk(result, now, call)
                    result.completion_tokens += 1
                    result.text += choice.get("text") or ""

    def _record_chunk(self, result: RequestResult, now: float, call: Any = None) -> None:
        if call is not None:
            call.chunk()  # the tokentrace client span's chunk time (an append)
        if result.first_chunk is None:
            result.first_chunk = now
        result.chunk_times.append(now)

    def _read_body(self, result: RequestResult, response: httpx.Response) -> None:
        if response.status_code != 200:
            result.error = f"HTTP {response.status_code}: {response.text[:200]}"
            return
        data = response.json()
        result.text = data["choices"][0]["text"]
        result.completion_tokens = int(data["usage"]["completion_tokens"])


def run_load(
    base_url: str, specs: Sequence[RequestSpec], *, concurrency: int | None = None, **kwargs: Any
) -> list[RequestResult]:
    """Run a load to completion from synchronous code (starts its own event loop)."""

    async def main() -> list[RequestResult]:
        return await LoadGenerator(base_url, **kwargs).run(specs, concurrency=concurrency)

    return asyncio.run(main())


def summarize(results: Sequence[RequestResult]) -> dict[str, Any]:
    """Return client-side percentiles (ms) of TTFT, e2e and inter-chunk gaps, and error counts."""

    def pct(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        ordered = sorted(values)

        def at(q: float) -> float:
            return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

        return {
            "p50": at(0.50),
            "p95": at(0.95),
            "p99": at(0.99),
            "max": round(1000 * ordered[-1], 2),
        }

    ok = [r for r in results if r.ok]
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "ttft_ms": pct([r.ttft_s for r in ok if r.ttft_s is not None]),
        "e2e_ms": pct([r.e2e_s for r in ok]),
        "itl_ms": pct([gap for r in ok for gap in r.itl_s]),
        "send_lag_ms_mean": round(1000 * statistics.fmean(r.send_lag_s for r in results), 2)
        if results
        else None,
    }


async def _amain(args: argparse.Namespace) -> None:
    base = DEFAULT_SCALING.get(args.trace, Scaling())
    scaling = Scaling(
        time_compression=args.time_compression,
        prompt_scale=args.prompt_scale or base.prompt_scale,
        output_scale=args.output_scale or base.output_scale,
        max_prompt_tokens=args.max_prompt_tokens,
        max_output_tokens=args.max_output_tokens,
    )
    specs = load_workload(args.trace, scaling=scaling, limit=args.limit)
    if args.poisson_rate:
        specs = with_poisson_arrivals(specs, args.poisson_rate, seed=args.seed)
    traced = args.otlp_endpoint is not None
    if traced:
        from tokentrace import instrumentation as tt

        # each request a client span: what the user felt, and the network bucket
        # (the server's span, continuing its traceparent, is subtracted from it)
        tt.configure(endpoint=args.otlp_endpoint, service_name=args.service_name)
    try:
        results = await LoadGenerator(args.url, traced=traced).run(
            specs, concurrency=args.concurrency
        )
    finally:
        if traced:
            tt.shutdown()  # the last spans go out before the process ends
    print(json.dumps(summarize(results), indent=2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Replay a real LLM trace against /v1/completions")
    parser.add_argument(
        "--url", default="http://127.0.0.1:8000", help="the server to load (default: %(default)s)"
    )
    parser.add_argument(
        "--trace",
        choices=available_traces(),
        default="azure_conv",
        help="the production trace to replay (default: %(default)s)",
    )
    parser.add_argument(
        "--limit", type=int, default=50, help="trace rows (requests) to read (default: %(default)s)"
    )
    parser.add_argument(
        "--time-compression",
        type=float,
        default=10.0,
        help="replay the trace's arrivals this many times faster (default: %(default)s)",
    )
    parser.add_argument(
        "--prompt-scale",
        type=float,
        default=None,
        help="multiply each trace prompt's token count by this (default: the trace's own "
        "scale, e.g. 0.1 for azure_conv)",
    )
    parser.add_argument(
        "--output-scale",
        type=float,
        default=None,
        help="multiply each trace output's token count by this (default: the trace's own "
        "scale, e.g. 0.3 for azure_conv)",
    )
    parser.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=400,
        help="cap on a prompt's tokens after scaling (default: %(default)s)",
    )
    parser.add_argument(
        "--max-output-tokens",
        type=int,
        default=128,
        help="cap on an output's tokens after scaling (default: %(default)s)",
    )
    parser.add_argument(
        "--poisson-rate",
        type=float,
        default=None,
        help="replace the trace's arrivals with Poisson arrivals at this rate (req/s; "
        "default: the trace's own arrivals)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="closed loop with N in flight (default: open loop, at the arrival times)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the Poisson arrivals (default: %(default)s)"
    )
    parser.add_argument(
        "--otlp-endpoint",
        default=None,
        help="trace each request as a tokentrace client span to this OTLP/HTTP endpoint"
        " (e.g. http://127.0.0.1:4318): measures the network bucket (default: untraced)",
    )
    parser.add_argument(
        "--service-name",
        default="load-generator",
        help="service.name of the client spans (default: %(default)s)",
    )
    asyncio.run(_amain(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
