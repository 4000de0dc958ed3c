"""SDK test fixtures: the real OTel SDK exporting to memory, or over OTLP to a real serve."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _cold_start
from tokentrace.instrumentation._runtime import Runtime, runtime


class MemorySdk:
    """The SDK configured with an in-memory exporter; `.spans()` flushes and gives them."""

    def __init__(self, exporter: InMemorySpanExporter, tracing: tt.Tracing) -> None:
        self.exporter = exporter
        self.tracing = tracing

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        assert self.tracing.force_flush(5_000)
        got = list(self.exporter.get_finished_spans())
        return [s for s in got if name is None or s.name == name]

    def wait_for(self, name: str, count: int = 1, timeout_s: float = 60.0) -> list[ReadableSpan]:
        """Gives the spans named `name` once `count` have ended (a server thread ends its own);
        waits up to `timeout_s` (it returns as soon as they are there: a loaded machine's
        server thread may end its span seconds late)."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.spans(name)
            if len(got) >= count or time.monotonic() > deadline:
                return got
            time.sleep(0.01)

    def otlp_bytes(self) -> bytes:
        """Gives the finished spans as the OTLP protobuf body the real exporter would send."""
        return encode_spans(self.spans()).SerializeToString()


@pytest.fixture
def memory_sdk() -> Iterator[MemorySdk]:
    _cold_start.tracker.reset()
    exporter = InMemorySpanExporter()
    tracing = tt.configure(service_name="sdk-test", exporter=exporter)
    yield MemorySdk(exporter, tracing)
    tt.shutdown()
    _cold_start.tracker.reset()


@pytest.fixture
def unconfigured() -> Iterator[Runtime]:
    """The SDK's runtime as a new process has it (nothing configured); shut down and
    unconfigured again after the test."""
    runtime.reset()
    yield runtime
    tt.shutdown()
    runtime.reset()


@pytest.fixture
def serve_sdk(serve):  # type: ignore[no-untyped-def]
    """A real `tokentrace serve` and the SDK exporting to it over OTLP/HTTP."""
    _cold_start.tracker.reset()
    tracing = tt.configure(endpoint=serve.otlp_http, service_name="sdk-e2e")
    yield serve, tracing
    tt.shutdown()
