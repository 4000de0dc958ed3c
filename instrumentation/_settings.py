"""The SDK's settings: one typed object, each value from its argument, else the
environment (tokentrace's variables, then OpenTelemetry's), else a default."""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from opentelemetry.sdk.resources import SERVICE_NAME

from tokentrace.instrumentation._safety import log_once

#: Environment variables the SDK reads (documented in README "Configuration").
ENV_ENDPOINT = "TOKENTRACE_ENDPOINT"
ENV_SERVICE_NAME = "TOKENTRACE_SERVICE_NAME"
ENV_PROTOCOL = "TOKENTRACE_PROTOCOL"
ENV_RECORD_CONTENT = "TOKENTRACE_RECORD_CONTENT"
ENV_DISABLED = "TOKENTRACE_DISABLED"
#: OpenTelemetry's switch for the whole SDK (only "true" turns it off, as OpenTelemetry
#: reads it): its tracers make no spans then, and tokentrace exports nothing either
ENV_OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"
#: Standard OpenTelemetry variables honoured as fallbacks: a per-signal one
#: (`…_TRACES_…`, `…_METRICS_…`) before the general one, as OpenTelemetry's own
#: exporters read them; `OTEL_RESOURCE_ATTRIBUTES`' `service.name` after `OTEL_SERVICE_NAME`.
ENV_OTEL_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
ENV_OTEL_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENV_OTEL_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
ENV_OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
ENV_OTEL_RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
ENV_OTEL_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
ENV_OTEL_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
ENV_OTEL_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"

PROTOCOLS = ("http/protobuf", "grpc")
DEFAULT_HTTP_ENDPOINT = "http://127.0.0.1:4318"
DEFAULT_GRPC_ENDPOINT = "http://127.0.0.1:4317"
DEFAULT_SERVICE_NAME = "llm-server"
DEFAULT_COLD_START_REQUESTS = 1
DEFAULT_COLD_START_IDLE_S = 300.0


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def disabled_by_env() -> bool:
    """Whether the environment turns the SDK off: `TOKENTRACE_DISABLED`, or
    OpenTelemetry's `OTEL_SDK_DISABLED=true` (under which its tracers make no spans,
    and GPU samples, which tokentrace exports itself, went out all the same)."""
    env = os.environ
    otel = (env.get(ENV_OTEL_SDK_DISABLED) or "").strip().lower() == "true"
    return otel or _truthy(env.get(ENV_DISABLED))


@dataclass(frozen=True, slots=True)
class Settings:
    """What the SDK runs with; `Settings.resolve()` gives them from arguments and the environment."""

    #: the collector's base URL (explicit argument, `TOKENTRACE_ENDPOINT`,
    #: `OTEL_EXPORTER_OTLP_ENDPOINT` or the default): no signal path
    endpoint: str
    service_name: str
    #: the protocol spans are exported with
    protocol: str
    record_content: bool
    disabled: bool
    #: Requests marked `tokentrace.cold_start` after process start or an idle gap.
    cold_start_requests: int = DEFAULT_COLD_START_REQUESTS
    #: Idle seconds after which the next requests count as cold again.
    cold_start_idle_s: float = DEFAULT_COLD_START_IDLE_S
    #: where spans go: the full OTLP/HTTP URL (`…/v1/traces`, or
    #: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as written), or the gRPC endpoint;
    #: left empty, made from `endpoint` and `protocol`
    traces_endpoint: str = ""
    #: where GPU samples go, likewise (`…/v1/metrics`, `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`)
    metrics_endpoint: str = ""
    #: the protocol GPU samples are exported with; left empty, `protocol`
    metrics_protocol: str = ""

    def __post_init__(self) -> None:
        if not self.metrics_protocol:
            object.__setattr__(self, "metrics_protocol", self.protocol)
        if not self.traces_endpoint:
            url = _signal_url(self.endpoint, self.protocol, "/v1/traces")
            object.__setattr__(self, "traces_endpoint", url)
        if not self.metrics_endpoint:
            url = _signal_url(self.endpoint, self.metrics_protocol, "/v1/metrics")
            object.__setattr__(self, "metrics_endpoint", url)

    @classmethod
    def resolve(
        cls,
        endpoint: str | None = None,
        service_name: str | None = None,
        protocol: str | None = None,
        record_content: bool | None = None,
        disabled: bool | None = None,
        cold_start_requests: int | None = None,
        cold_start_idle_s: float | None = None,
    ) -> Settings:
        env = os.environ
        try:
            cold_n = (
                DEFAULT_COLD_START_REQUESTS
                if cold_start_requests is None
                else int(cold_start_requests)
            )
        except (TypeError, ValueError, OverflowError):
            raise ValueError(
                f"cold_start_requests must be a whole number, not {cold_start_requests!r}"
            ) from None
        try:
            cold_idle = (
                DEFAULT_COLD_START_IDLE_S if cold_start_idle_s is None else float(cold_start_idle_s)
            )
        except (TypeError, ValueError):
            raise ValueError(
                f"cold_start_idle_s must be a number of seconds, not {cold_start_idle_s!r}"
            ) from None
        if cold_n < 0:
            raise ValueError(f"cold_start_requests must be >= 0, not {cold_n}")
        if cold_idle <= 0:
            raise ValueError(f"cold_start_idle_s must be > 0, not {cold_idle}")
        proto = _resolve_protocol(protocol, ENV_OTEL_TRACES_PROTOCOL)
        metrics_proto = _resolve_protocol(protocol, ENV_OTEL_METRICS_PROTOCOL)
        default_endpoint = DEFAULT_GRPC_ENDPOINT if proto == "grpc" else DEFAULT_HTTP_ENDPOINT
        ep = endpoint or env.get(ENV_ENDPOINT) or env.get(ENV_OTEL_ENDPOINT) or default_endpoint
        ep = _checked_endpoint(ep)
        return cls(
            endpoint=_base_endpoint(ep, proto),
            service_name=service_name or service_name_from_env(),
            protocol=proto,
            record_content=record_content
            if record_content is not None
            else _truthy(env.get(ENV_RECORD_CONTENT)),
            disabled=disabled if disabled is not None else disabled_by_env(),
            cold_start_requests=cold_n,
            cold_start_idle_s=cold_idle,
            traces_endpoint=_resolve_signal_endpoint(
                endpoint, ENV_OTEL_TRACES_ENDPOINT, proto, "/v1/traces"
            ),
            metrics_endpoint=_resolve_signal_endpoint(
                endpoint, ENV_OTEL_METRICS_ENDPOINT, metrics_proto, "/v1/metrics"
            ),
            metrics_protocol=metrics_proto,
        )


def service_name_from_env() -> str:
    """Gives the service name the environment sets: `TOKENTRACE_SERVICE_NAME`, else
    `OTEL_SERVICE_NAME`, else `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, else
    `DEFAULT_SERVICE_NAME`.

    The SDK's default must not be passed to `Resource.create` where the environment
    names the service: explicit attributes win there, and every span would read
    `llm-server` under `OTEL_RESOURCE_ATTRIBUTES=service.name=chat-api`.
    """
    env = os.environ
    name = env.get(ENV_SERVICE_NAME) or env.get(ENV_OTEL_SERVICE_NAME)
    if name:
        return name
    # `key=value` pairs split on `,`, the value percent-decoded, the last pair of a key
    # winning: as OpenTelemetry's `OTELResourceDetector` reads them (which also logs a
    # malformed pair; `Resource.create` does that once, not here a second time)
    for item in (env.get(ENV_OTEL_RESOURCE_ATTRIBUTES) or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip() == SERVICE_NAME:
            name = unquote(value.strip())
    return name or DEFAULT_SERVICE_NAME


def _resolve_protocol(protocol: str | None, signal_env: str) -> str:
    """Gives a signal's protocol: `protocol`, `TOKENTRACE_PROTOCOL`, the signal's
    `OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL`, `OTEL_EXPORTER_OTLP_PROTOCOL`, else OTLP/HTTP."""
    env = os.environ
    proto = (
        protocol
        or env.get(ENV_PROTOCOL)
        or env.get(signal_env)
        or env.get(ENV_OTEL_PROTOCOL)
        or "http/protobuf"
    )
    if proto == "http/json" and not protocol:
        # OpenTelemetry's third protocol, set for the host's other exporters: every
        # OTLP/HTTP receiver takes protobuf too, so the same endpoint serves
        log_once(
            "OTLP protocol http/json from the environment",
            detail=": tokentrace exports OTLP/HTTP as protobuf to the same endpoint",
        )
        proto = "http/protobuf"
    if proto not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, not {proto!r}")
    return proto


def _resolve_signal_endpoint(
    endpoint: str | None, signal_env: str, protocol: str, path: str
) -> str:
    """Gives where one signal goes: `endpoint`, else `TOKENTRACE_ENDPOINT`, else the
    signal's `OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT` as written (OpenTelemetry's
    full per-signal URL: nothing is added or taken off), else `OTEL_EXPORTER_OTLP_ENDPOINT`,
    else the default; a base URL gets the signal's OTLP/HTTP `path`."""
    env = os.environ
    own = endpoint or env.get(ENV_ENDPOINT)
    if not own:
        per_signal = env.get(signal_env)
        if per_signal and per_signal.strip():
            return _checked_endpoint(per_signal)
    default = DEFAULT_GRPC_ENDPOINT if protocol == "grpc" else DEFAULT_HTTP_ENDPOINT
    base = _checked_endpoint(own or env.get(ENV_OTEL_ENDPOINT) or default)
    return _signal_url(_base_endpoint(base, protocol), protocol, path)


def _signal_url(base: str, protocol: str, path: str) -> str:
    """Gives a signal's URL on the collector at `base`: OTLP/HTTP adds the signal's path."""
    return base if protocol == "grpc" else f"{base}{path}"


def _checked_endpoint(endpoint: object) -> str:
    """Gives `endpoint` without surrounding blanks (an environment value's newline);
    raises a clear `ValueError` unless it is an http(s) URL naming a host."""
    if not isinstance(endpoint, str):
        raise ValueError(
            f"endpoint must be a URL such as {DEFAULT_HTTP_ENDPOINT!r}, "
            f"not the {type(endpoint).__name__} {endpoint!r}"
        )
    endpoint = endpoint.strip()
    try:
        parts = urlsplit(endpoint)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number or out of range
    except ValueError as exc:
        raise ValueError(f"endpoint {endpoint!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"endpoint must be an http:// or https:// URL with a host "
            f"(such as {DEFAULT_HTTP_ENDPOINT!r}), not {endpoint!r}"
        )
    return endpoint


#: OTLP/HTTP's signal paths, which tokentrace adds to the endpoint itself
SIGNAL_PATHS = ("/v1/traces", "/v1/metrics")


def _base_endpoint(endpoint: str, protocol: str) -> str:
    """Gives the collector's base URL: `endpoint` without a trailing `/` or signal path.

    An OTLP/HTTP endpoint is the base (`OTEL_EXPORTER_OTLP_ENDPOINT`'s meaning);
    the per-signal form `http://host:4318/v1/traces` is what people copy from
    their OpenTelemetry settings, and would otherwise become `…/v1/traces/v1/traces`:
    a 404 on every export, every span lost.
    """
    base = endpoint.rstrip("/")
    if protocol != "grpc":
        for path in SIGNAL_PATHS:
            if base.endswith(path):
                base = base[: -len(path)]
                log_once(
                    "the OTLP endpoint ends in a signal path",
                    detail=f" ({endpoint!r}): tokentrace adds /v1/traces and /v1/metrics itself; "
                    f"read as {base!r}",
                )
                break
    return base
