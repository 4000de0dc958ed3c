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
from tokentrace.instrumentation._config import Settings, Tracing, configure, get_tracing, shutdown
from tokentrace.instrumentation._request import (
    RequestTrace,
    current_request,
    phase,
    request,
    traced_request,
)

__all__ = sorted(
    [
        "RequestTrace",
        "Settings",
        "Tracing",
        "configure",
        "current_request",
        "get_tracing",
        "phase",
        "request",
        "semconv",
        "shutdown",
        "traced_request",
    ]
)
