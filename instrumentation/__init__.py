"""tokentrace's SDK: drop-in tracing for LLM serving code.

Importing this package is light: it needs only the OpenTelemetry SDK and
exporters (never DuckDB, FastAPI, Polars or torch).

Quick start::

    from tokentrace import instrumentation as tt

    tt.configure(service_name="my-llm")          # OTLP to 127.0.0.1:4318
    with tt.request(model="tiny", headers=request.headers) as req:
        with req.phase("tokenize"):
            ids = tokenizer.encode(prompt)
        req.start_phase("queue")   # ... the scheduler picks it up ...
        for tok in generate(ids):
            req.token()
"""

from tokentrace.instrumentation import semconv
from tokentrace.instrumentation._asgi import (
    TokentraceMiddleware,
    instrument_fastapi,
    request_from_headers,
    uninstrument_fastapi,
)
from tokentrace.instrumentation._client import ClientRequest, client_request
from tokentrace.instrumentation._decorators import phase, traced_request
from tokentrace.instrumentation._forward import instrument_model, uninstrument_model
from tokentrace.instrumentation._gpu import GpuReading, GpuSampler, start_gpu_sampler
from tokentrace.instrumentation._httpx import instrument_httpx, uninstrument_httpx
from tokentrace.instrumentation._openai import instrument_openai, uninstrument_openai
from tokentrace.instrumentation._request import (
    RequestTrace,
    TokenBatch,
    current_request,
    record_tokens,
    request,
)
from tokentrace.instrumentation._runtime import configure, get_tracing, shutdown
from tokentrace.instrumentation._settings import Settings
from tokentrace.instrumentation._steps import EngineStep, engine_step, record_step
from tokentrace.instrumentation._tokenizer import wrap_tokenizer
from tokentrace.instrumentation._tracing import Tracing
from tokentrace.instrumentation._transformers import (
    instrument_transformers_generate,
    uninstrument_transformers_generate,
)

__all__ = [
    "ClientRequest",
    "EngineStep",
    "GpuReading",
    "GpuSampler",
    "RequestTrace",
    "Settings",
    "TokenBatch",
    "TokentraceMiddleware",
    "Tracing",
    "client_request",
    "configure",
    "current_request",
    "engine_step",
    "get_tracing",
    "instrument_fastapi",
    "instrument_httpx",
    "instrument_model",
    "instrument_openai",
    "instrument_transformers_generate",
    "phase",
    "record_step",
    "record_tokens",
    "request",
    "request_from_headers",
    "semconv",
    "shutdown",
    "start_gpu_sampler",
    "traced_request",
    "uninstrument_fastapi",
    "uninstrument_httpx",
    "uninstrument_model",
    "uninstrument_openai",
    "uninstrument_transformers_generate",
    "wrap_tokenizer",
]
