"""The SDK's exported names, light imports for every module, and the optional integrations."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from tokentrace import instrumentation as tt

HEAVY = (
    "duckdb",
    "fastapi",
    "polars",
    "uvicorn",
    "torch",
    "starlette",
    "httpx",
    "openai",
    "transformers",
    "pynvml",
)
MODULES = (
    "_asgi",
    "_background",
    "_client",
    "_decorators",
    "_exit",
    "_forward",
    "_gpu",
    "_httpx",
    "_openai",
    "_pending_span",
    "_runtime",
    "_settings",
    "_steps",
    "_tokenizer",
    "_tracing",
    "_transformers",
)


def test_exported_names() -> None:
    assert tt.__all__ == sorted(tt.__all__)
    assert set(tt.__all__) == {
        "ClientRequest", "EngineStep", "GpuReading", "GpuSampler", "RequestTrace", "Settings",
        "TokenBatch", "TokentraceMiddleware", "Tracing", "client_request", "configure", "current_request", "engine_step",
        "get_tracing", "instrument_fastapi", "instrument_httpx", "instrument_model", "instrument_openai",
        "instrument_transformers_generate", "phase", "record_step", "record_tokens", "request", "request_from_headers",
        "semconv", "shutdown", "start_gpu_sampler", "traced_request", "uninstrument_fastapi",
        "uninstrument_httpx", "uninstrument_model", "uninstrument_openai",
        "uninstrument_transformers_generate", "wrap_tokenizer",
    }  # fmt: skip
    for name in tt.__all__:
        assert getattr(tt, name) is not None


@pytest.mark.parametrize("module", MODULES)
def test_integration_modules_import_nothing_heavy(module: str) -> None:
    code = (
        f"import sys, tokentrace.instrumentation.{module}\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize(
    ("package", "instrument", "uninstrument"),
    [
        ("openai", tt.instrument_openai, tt.uninstrument_openai),
        ("transformers", tt.instrument_transformers_generate, tt.uninstrument_transformers_generate),
    ],
)
def test_instrumenting_a_package_not_installed_says_so(
    package: str, instrument: Any, uninstrument: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # both are in the dev extra: hidden here as they are where only the SDK is installed
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, package, None)  # `import package` raises ImportError
    with pytest.raises(ImportError):
        instrument()
    uninstrument()  # nothing to undo: a no-op
