"""Runs one scenario for real: tiny server subprocess(es), delaying proxy, traced load.

The caller configures the tokentrace SDK in its own process first (the load
generator's client spans go through it); each server process traces itself to
`otlp_endpoint` under the scenario's `service.name`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tokentrace.examples.load.generator import (
    DEFAULT_LIMITS,
    LoadGenerator,
    PromptBuilder,
    RequestResult,
)
from tokentrace.examples.load.workloads import RequestSpec
from tokentrace.examples.netproxy import ProxyHandle, start_proxy

from .catalog import Deployment, Scenario

#: (done, total) after every finished request
Progress = Callable[[int, int], None]


@dataclass
class ScenarioRun:
    scenario: Scenario
    results: list[RequestResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def errors(self) -> int:
        return sum(1 for r in self.results if not r.ok)


def _listening_socket(host: str = "127.0.0.1") -> socket.socket:
    """Gives a socket listening on a free port of `host`: the port is held from here on.

    Picking a port with a bind and a close, for a server to bind later, races: in
    between, another process or an outgoing connection's ephemeral port can take it.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


class ServerProcess:
    """`python -m tokentrace.examples.tiny_llm.server` configured through TINY_LLM_* variables.

    The port is bound and listening here, before the process starts, and the process
    serves on that very socket (`--fd`): no other process can take the port in between.
    """

    def __init__(self, settings: dict[str, Any], log: Path | None = None) -> None:
        env = dict(os.environ)
        for key, value in settings.items():
            env[f"TINY_LLM_{key.upper()}"] = "none" if value is None else str(value)
        self._log = open(log or os.devnull, "ab")  # noqa: SIM115 - closed in stop()
        try:
            # ours is closed once the server has its copy: the port is freed when it exits
            with _listening_socket() as sock:
                self.port = int(sock.getsockname()[1])
                self.proc = subprocess.Popen(
                    [
                        sys.executable, "-m", "tokentrace.examples.tiny_llm.server",
                        "--log-level", "warning", "--fd", str(sock.fileno()),
                    ],
                    env=env,
                    stdout=self._log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(sock.fileno(),),
                )  # fmt: skip
        except BaseException:
            self._log.close()
            raise

    async def wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"tiny-llm server exited with {self.proc.returncode}")
                try:
                    if (
                        await client.get(f"http://127.0.0.1:{self.port}/health")
                    ).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        raise TimeoutError(f"tiny-llm server on port {self.port} not ready in {timeout_s} s")

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM: uvicorn shuts the app down, which flushes its spans to the collector."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _split(specs: Sequence[RequestSpec], parts: int) -> list[list[RequestSpec]]:
    """Cut the load into `parts` consecutive pieces, each with arrivals from 0."""
    size = -(-len(specs) // parts)
    pieces = []
    for i in range(parts):
        piece = list(specs[i * size : (i + 1) * size])
        if piece:
            t0 = piece[0].arrival_s
            pieces.append([dataclasses.replace(s, arrival_s=s.arrival_s - t0) for s in piece])
    return pieces


async def _replay(
    gen: LoadGenerator, specs: Sequence[RequestSpec], concurrency: int | None,
    on_done: Callable[[RequestResult], None],
) -> list[RequestResult]:  # fmt: skip
    async with httpx.AsyncClient(timeout=gen.timeout_s, limits=DEFAULT_LIMITS) as client:
        if concurrency is not None:
            results: list[RequestResult] = []
            queue = list(specs)

            async def worker() -> None:
                while queue:
                    spec = queue.pop(0)
                    result = await gen.send(client, spec, scheduled_at=gen.clock())
                    results.append(result)
                    on_done(result)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return results
        t0 = gen.clock()

        async def at_arrival(spec: RequestSpec) -> RequestResult:
            due = t0 + spec.arrival_s
            delay = due - gen.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            result = await gen.send(client, spec, scheduled_at=due)
            on_done(result)
            return result

        return list(await asyncio.gather(*(at_arrival(s) for s in specs)))


async def _run_deployment(
    scenario: Scenario,
    deployment: Deployment,
    specs: list[RequestSpec],
    otlp_endpoint: str,
    prompts: PromptBuilder,
    on_done: Callable[[RequestResult], None],
    log_dir: Path | None,
) -> list[RequestResult]:
    settings: dict[str, Any] = {
        "threads": 1,  # one core for the model, the other for the client and the collector
        **deployment.server,
        "otlp_endpoint": otlp_endpoint,
        "service_name": scenario.service,
        "environment": deployment.environment,
    }
    results: list[RequestResult] = []
    for i, piece in enumerate(_split(specs, deployment.instances)):
        log = (
            None
            if log_dir is None
            else log_dir / f"{scenario.service}-{deployment.environment or 'default'}-{i}.log"
        )
        server = ServerProcess(settings, log)
        proxy: ProxyHandle | None = None
        try:
            await server.wait_ready()
            proxy = start_proxy(0, server.port, deployment.proxy_delay_ms)
            gen = LoadGenerator(proxy.url, prompt_builder=prompts, traced=True)
            results += await _replay(gen, piece, deployment.concurrency, on_done)
        finally:
            if proxy is not None:
                proxy.stop()
            await asyncio.to_thread(server.stop)
    return results


def run_scenario(
    scenario: Scenario,
    otlp_endpoint: str,
    *,
    quick: bool = False,
    progress: Progress | None = None,
    prompts: PromptBuilder | None = None,
    log_dir: Path | None = None,
) -> ScenarioRun:
    """Serve `scenario` and replay its load; return what the client saw.

    The tokentrace SDK must already be configured in this process (client spans).
    """
    loads = [d.load(quick) for d in scenario.deployments]
    total = sum(len(specs) for specs in loads)
    prompts = prompts or PromptBuilder()
    done = [0]

    def on_done(_: RequestResult) -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    async def main() -> list[RequestResult]:
        parts = await asyncio.gather(
            *(
                _run_deployment(scenario, d, specs, otlp_endpoint, prompts, on_done, log_dir)
                for d, specs in zip(scenario.deployments, loads, strict=True)
            )
        )
        return [r for part in parts for r in part]

    started = time.perf_counter()
    results = asyncio.run(main())
    return ScenarioRun(scenario, results, time.perf_counter() - started)
