"""SDK configuration: one typed object, explicit argument → environment → default."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Tracer

logger = logging.getLogger("tokentrace")

#: Environment variables the SDK reads (documented in README "Configuration").
ENV_ENDPOINT = "TOKENTRACE_ENDPOINT"
ENV_SERVICE_NAME = "TOKENTRACE_SERVICE_NAME"
ENV_PROTOCOL = "TOKENTRACE_PROTOCOL"
ENV_RECORD_CONTENT = "TOKENTRACE_RECORD_CONTENT"
ENV_DISABLED = "TOKENTRACE_DISABLED"
#: Standard OpenTelemetry variables honoured as fallbacks.
ENV_OTEL_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
ENV_OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
ENV_OTEL_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"

PROTOCOLS = ("http/protobuf", "grpc")
DEFAULT_HTTP_ENDPOINT = "http://127.0.0.1:4318"
DEFAULT_GRPC_ENDPOINT = "http://127.0.0.1:4317"
DEFAULT_SERVICE_NAME = "llm-server"
SCOPE_NAME = "tokentrace"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class Settings:
    endpoint: str
    service_name: str
    protocol: str
    record_content: bool
    disabled: bool

    @classmethod
    def resolve(
        cls,
        endpoint: str | None = None,
        service_name: str | None = None,
        protocol: str | None = None,
        record_content: bool | None = None,
        disabled: bool | None = None,
    ) -> Settings:
        env = os.environ
        proto = protocol or env.get(ENV_PROTOCOL) or env.get(ENV_OTEL_PROTOCOL) or "http/protobuf"
        if proto not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, not {proto!r}")
        default_endpoint = DEFAULT_GRPC_ENDPOINT if proto == "grpc" else DEFAULT_HTTP_ENDPOINT
        ep = endpoint or env.get(ENV_ENDPOINT) or env.get(ENV_OTEL_ENDPOINT) or default_endpoint
        if not ep.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must be an http:// or https:// URL, not {ep!r}")
        return cls(
            endpoint=ep.rstrip("/"),
            service_name=service_name
            or env.get(ENV_SERVICE_NAME)
            or env.get(ENV_OTEL_SERVICE_NAME)
            or DEFAULT_SERVICE_NAME,
            protocol=proto,
            record_content=record_content
            if record_content is not None
            else _truthy(env.get(ENV_RECORD_CONTENT)),
            disabled=disabled if disabled is not None else _truthy(env.get(ENV_DISABLED)),
        )


def _make_exporter(settings: Settings) -> SpanExporter:
    if settings.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        return Grpc(endpoint=settings.endpoint, insecure=settings.endpoint.startswith("http://"), timeout=5)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    return Http(endpoint=f"{settings.endpoint}/v1/traces", timeout=5)


class Tracing:
    """The SDK's live state: settings, tracer provider and tracer."""

    def __init__(
        self,
        settings: Settings,
        provider: TracerProvider,
        owns_provider: bool,
    ) -> None:
        self.settings = settings
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer(SCOPE_NAME)
        self._owns_provider = owns_provider

    def force_flush(self, timeout_ms: int = 10_000) -> bool:
        return bool(self.provider.force_flush(timeout_ms))

    def shutdown(self) -> None:
        if self._owns_provider:
            self.provider.shutdown()


_lock = threading.Lock()
_tracing: Tracing | None = None


def configure(
    endpoint: str | None = None,
    service_name: str | None = None,
    protocol: str | None = None,
    *,
    record_content: bool | None = None,
    resource_attributes: dict[str, Any] | None = None,
    tracer_provider: TracerProvider | None = None,
    exporter: SpanExporter | None = None,
    disabled: bool | None = None,
) -> Tracing:
    """Gives the configured SDK: spans go over OTLP to a tokentrace collector.

    Pass `tracer_provider` to reuse the host's own OpenTelemetry set-up, or
    `exporter` to export somewhere else (tests use an in-memory exporter).
    Calling it again replaces the previous configuration (which is shut down).
    """
    global _tracing
    settings = Settings.resolve(endpoint, service_name, protocol, record_content, disabled)
    owns = tracer_provider is None
    if tracer_provider is None:
        attrs: dict[str, Any] = {"service.name": settings.service_name, "process.pid": os.getpid()}
        attrs.update(resource_attributes or {})
        tracer_provider = TracerProvider(resource=Resource.create(attrs))
        if not settings.disabled:
            # Bounded queue, export on a daemon thread: the host never waits on
            # the collector, and a dead collector costs dropped spans, not latency.
            tracer_provider.add_span_processor(
                BatchSpanProcessor(
                    exporter or _make_exporter(settings),
                    max_queue_size=8192,
                    schedule_delay_millis=500,
                    max_export_batch_size=512,
                )
            )
    tracing = Tracing(settings, tracer_provider, owns_provider=owns)
    with _lock:
        previous, _tracing = _tracing, tracing
    if previous is not None:
        previous.shutdown()
    return tracing


def get_tracing() -> Tracing:
    """Gives the current SDK state, configuring from the environment on first use."""
    tracing = _tracing
    if tracing is None:
        with _lock:
            tracing = _tracing
        if tracing is None:
            tracing = configure()
    return tracing


def shutdown() -> None:
    """Flushes and stops the exporter; safe to call twice."""
    global _tracing
    with _lock:
        tracing, _tracing = _tracing, None
    if tracing is not None:
        try:
            tracing.force_flush(5_000)
        finally:
            tracing.shutdown()
