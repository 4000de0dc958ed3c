"""Real engines for tests: the engine venv, the tiny model, vLLM and the example server as
subprocesses on 127.0.0.1, and the client driver.  Import as `from engine_kit import ...`
(pytest puts tests/engines on the path of the tests in it; record.py runs from it).

vLLM and the clients run with `.venv-engines/bin/python` (scripts/engine-venv makes it); the
test process only starts them, waits and reads what they wrote.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from scenarios import SERVED_MODEL, VLLM_ARGS

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VENV = REPO / ".venv-engines"
ENGINE_PYTHON = VENV / "bin" / "python"
RECORDINGS = REPO / "tests" / "data" / "engines"
#: vLLM's start (weights, KV cache, API server) took ~30 s here; a loaded machine more
VLLM_READY_S = 240.0


def free_port() -> int:
    """Gives a loopback port that was free a moment ago (the engines bind it themselves)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def engine_venv_missing() -> str | None:
    """Gives why the engine venv cannot be used, or None when it is complete."""
    check = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "engine-venv"), "--check"],
        capture_output=True,
        text=True,
    )
    if check.returncode == 0:
        return None
    return (
        f"no complete engine venv at {VENV} (real vLLM and client instrumentations): "
        "create it with scripts/engine-venv (minutes, ~3.5 GB)"
    )


def engine_env(**extra: str) -> dict[str, str]:
    """Gives the environment of a process of the engine venv: no inherited Python paths."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "OTEL_", "VIRTUAL_ENV"))
    }
    env.update(PYTHONUNBUFFERED="1", PYTHONNOUSERSITE="1", **extra)
    return env


def build_tiny_model(out: Path) -> dict[str, Any]:
    """Builds the random-weight Llama and its tokenizer into `out`; gives its description."""
    done = subprocess.run(
        [str(ENGINE_PYTHON), str(HERE / "tiny_model.py"), str(out)],
        capture_output=True,
        text=True,
        env=engine_env(),
        timeout=300,
        check=True,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@dataclass
class EngineProcess:
    """A server process of its own session (its workers die with it), logging to a file."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def wait_ready(self, path: str, timeout_s: float) -> float:
        """Waits until `path` answers 200; gives the seconds it took."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"exited with {self.proc.returncode} while starting:\n{self.tail()}"
                )
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}{path}", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"not ready in {timeout_s} s:\n{self.tail()}")

    def stop(self, timeout_s: float = 60.0) -> float:
        """SIGTERMs the process (it flushes its spans), its group when it lingers; gives the
        seconds it took."""
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        try:  # workers left behind (vLLM's engine core) go with the group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return time.monotonic() - started

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _spawn(cmd: list[str], env: dict[str, str], log: Path, port: int) -> EngineProcess:
    # nice: two cores are shared with whatever else runs here; its own session: stopped whole
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["nice", "-n", "10", *cmd],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=log.parent,
        )
    return EngineProcess(proc, port, log)


def start_vllm(model_dir: Path, otlp_grpc: str, log: Path, *extra: str) -> EngineProcess:
    """Starts vLLM's OpenAI server on the CPU, its spans to `otlp_grpc`; ready when it returns."""
    port = free_port()
    cmd = [
        str(ENGINE_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir),
        "--served-model-name", SERVED_MODEL,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager",
        "--otlp-traces-endpoint", otlp_grpc,
        *VLLM_ARGS, *extra,
    ]  # fmt: skip
    env = engine_env(
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE="1",
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="grpc",
        OTEL_EXPORTER_OTLP_TRACES_INSECURE="true",
        # spans leave within a fifth of a second, so a scenario's end is seen at once
        OTEL_BSP_SCHEDULE_DELAY="200",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    server = _spawn(cmd, env, log, port)
    server.wait_ready("/health", VLLM_READY_S)
    return server


def start_tiny_llm(otlp_http: str, log: Path) -> EngineProcess:
    """Starts the project's example server (tokentrace SDK) with its spans to `otlp_http`."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "tokentrace.examples.tiny_llm.server",
        "--port", str(port), "--otlp-endpoint", otlp_http,
        "--service-name", "tiny-llm-engines", "--threads", "1", "--log-level", "warning",
    ]  # fmt: skip
    server = _spawn(cmd, {**os.environ, "PYTHONUNBUFFERED": "1"}, log, port)
    server.wait_ready("/health", 120.0)
    return server


@dataclass
class ClientRun:
    """What one client driver run measured (`requests`: one dict per request)."""

    scenario: str
    seconds: float
    requests: list[dict[str, Any]] = field(default_factory=list)


def run_client(
    scenario: str, base_url: str, otlp_http: str, out: Path, timeout_s: float = 180
) -> ClientRun:
    """Runs the scenario's instrumented OpenAI client against `base_url`; gives its measures."""
    cmd = [
        str(ENGINE_PYTHON), str(HERE / "client_driver.py"), scenario,
        "--base-url", base_url, "--otlp", otlp_http, "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=engine_env(TRACELOOP_TELEMETRY="false"),
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise RuntimeError(f"client {scenario} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    doc = json.loads(out.read_text(encoding="utf-8"))
    return ClientRun(doc["scenario"], doc["seconds"], doc["requests"])
