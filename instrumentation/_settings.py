"""SDK configuration: one typed object, explicit argument → environment → default."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote, urlsplit

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import DEFAULT_ON
from opentelemetry.trace import Tracer

from tokentrace.instrumentation import _export, _pending_span
from tokentrace.instrumentation._export import SHUTDOWN_TIMEOUT_S, GuardedExporter
from tokentrace.instrumentation._pending_span import PresetIdGenerator
from tokentrace.instrumentation._safety import log_once

logger = logging.getLogger("tokentrace")

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
SCOPE_NAME = "tokentrace"
DEFAULT_COLD_START_REQUESTS = 1
DEFAULT_COLD_START_IDLE_S = 300.0
#: the span queue of the SDK's own provider (spans; a full queue drops, counted) and
#: its export batches
SPAN_QUEUE_SIZE = 8192
SPAN_BATCH_SIZE = 512
SPAN_SCHEDULE_DELAY_MS = 500


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _disabled_by_env() -> bool:
    """Whether the environment turns the SDK off: `TOKENTRACE_DISABLED`, or
    OpenTelemetry's `OTEL_SDK_DISABLED=true` (under which its tracers make no spans,
    and GPU samples, which tokentrace exports itself, went out all the same)."""
    env = os.environ
    otel = (env.get(ENV_OTEL_SDK_DISABLED) or "").strip().lower() == "true"
    return otel or _truthy(env.get(ENV_DISABLED))


@dataclass(frozen=True, slots=True)
class Settings:
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
            service_name=service_name or _service_name_from_env(),
            protocol=proto,
            record_content=record_content
            if record_content is not None
            else _truthy(env.get(ENV_RECORD_CONTENT)),
            disabled=disabled if disabled is not None else _disabled_by_env(),
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


def _service_name_from_env() -> str:
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


def _make_exporter(settings: Settings) -> GuardedExporter:
    """Gives the OTLP span exporter, guarded: a collector that is down or never
    answers costs dropped spans, never the host's time (see `_export`)."""
    return _export.otlp_exporter(settings.traces_endpoint, settings.protocol)


class HashOnceResource(Resource):
    """A resource whose hash is computed once.

    OpenTelemetry's OTLP encoder groups the spans of every export batch by
    resource and so hashes the resource once a span; `Resource.__hash__`
    JSON-encodes all its attributes, sorted, each time: a fifth to a quarter
    of encoding a request's spans (opentelemetry-sdk 1.45, benchmarks/bench_sdk.py).
    A resource never changes, so its hash is kept.  Equal to, and hashed
    like, a plain `Resource` with the same attributes.
    """

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


class Tracing:
    """The SDK's live state: settings, tracer provider and tracer."""

    def __init__(
        self,
        settings: Settings,
        provider: TracerProvider,
        owns_provider: bool,
        exporter: GuardedExporter | None = None,
    ) -> None:
        self.settings = settings
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer(SCOPE_NAME)
        self._owns_provider = owns_provider
        #: the guarded OTLP exporter, when the SDK made it (not a host's `exporter=`)
        self.exporter = exporter
        #: set once `shutdown()` ran (or `configure()` replaced it): what is
        #: still in flight moves to the configuration current then, if any
        self.closed = False
        #: set when request spans may be built off the host's thread with ids
        #: drawn at the start: our own provider, its id generator, the default sampler
        self.pending_ids: PresetIdGenerator | None = None
        #: `configure()`'s own arguments, when it made the provider: a forked
        #: child makes its configuration again from them (see `_after_fork_in_child`)
        self.configured_with: dict[str, Any] | None = None
        ids = getattr(provider, "id_generator", None)
        if owns_provider and isinstance(ids, PresetIdGenerator) and provider.sampler is DEFAULT_ON:
            self.pending_ids = ids
        #: the provider flush under way: one at a time, later calls wait on it
        self._flush = _export.SingleFlight("flush")

    def force_flush(self, timeout_ms: int = 10_000) -> bool:
        """Emits buffered engine steps / timings, then flushes spans; gives success.

        Returns within about `timeout_ms` (OpenTelemetry's batch processor ignores
        it): False when the flush did not end by then (it goes on in the
        background) or spans were dropped, the collector being unreachable or
        slower than spans end.  One provider flush runs at a time: a call made
        while one is under way waits for it, then for the next (which covers this
        call's spans), never starting a thread of its own.
        """
        deadline = time.monotonic() + max(0, timeout_ms) / 1000
        exporter = self.exporter
        dropped = exporter.dropped if exporter is not None else 0
        _run_flush_hooks()
        left = max(0.0, deadline - time.monotonic())
        finished, ok = self._flush.run(lambda: self.provider.force_flush(int(left * 1000)), left)
        return bool(finished and ok) and (exporter is None or exporter.dropped == dropped)

    def shutdown(self, timeout_ms: int | None = None) -> bool:
        """Ends the provider (when the SDK made it): what is queued is exported for
        `timeout_ms` at most (default `SHUTDOWN_TIMEOUT_S`), then dropped; gives
        whether it ended in time.  Never waits on the collector longer than that."""
        self.closed = True
        if not self._owns_provider:
            return True
        timeout_s = SHUTDOWN_TIMEOUT_S if timeout_ms is None else max(0, timeout_ms) / 1000
        exporter = self.exporter
        if exporter is not None:
            exporter.begin_shutdown(time.monotonic() + timeout_s)
        finished, _ = _export.run_bounded(self.provider.shutdown, timeout_s, "shutdown")
        if not finished and exporter is not None:
            exporter.abort()  # its export under way ends at its retry wait; the rest is dropped
        return finished


_lock = threading.Lock()
_tracing: Tracing | None = None
#: Cold-path flushes (engine steps, CUDA timings, GPU sampler) run before the
#: provider flushes, so their last spans still leave the process.
_flush_hooks: list[Callable[[], object]] = []


def add_flush_hook(hook: Callable[[], object]) -> None:
    """Registers `hook` to run before spans are flushed at shutdown / reconfigure."""
    if hook not in _flush_hooks:
        _flush_hooks.append(hook)


def _run_flush_hooks() -> None:
    for hook in list(_flush_hooks):
        try:
            hook()
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once(f"flush hook {getattr(hook, '__qualname__', hook)!s}", exc)


#: Whether work waits in a queue (engine steps, finished requests, GPU samples):
#: added as each queue's daemon thread starts (`register_exit_flush`).
_waiting_checks: list[Callable[[], object]] = []
#: the pid that registered `_at_exit` through `register_exit_flush` (once per process)
_exit_flush_pid: int | None = None


def register_exit_flush(work_waits: Callable[[], object]) -> None:
    """Has this process's exit build and export what its queues hold, also where
    nothing configured the SDK: called when a queue's daemon thread starts (once a
    queue and process: never on the hot path, never at import).

    Recording an engine step or a GPU sample configures nothing (the flusher's
    first pass did, a second later), and without `configure()` no exit handler
    was registered: a process that only records steps (an engine core, forked or
    spawned) and exits before lost them all.  `work_waits` says whether anything
    waits; where it does and nothing configured the SDK, it is configured as first
    use would when the main thread ends, or in `shutdown()` (which atexit, or a
    multiprocessing child's exit finalizers, run).
    """
    global _exit_flush_pid
    if work_waits not in _waiting_checks:
        _waiting_checks.append(work_waits)
    pid = os.getpid()
    if _exit_flush_pid == pid:
        return
    try:
        with _lock:
            if _exit_flush_pid == pid:
                return
            _exit_flush_pid = pid
            # after a host provider's atexit shutdown registered before, so run before it
            atexit.unregister(_at_exit)
            atexit.register(_at_exit)
        _configure_when_the_main_thread_ends()
        _flush_at_multiprocessing_exit()  # where atexit does not run: a multiprocessing child
    except Exception as exc:  # the SDK's own failure must never reach the host
        log_once("exit flush", exc)


def _configure_when_the_main_thread_ends() -> None:
    """Has the SDK configured, where work waits and nothing configured it, when the
    main thread ends: by atexit it can no longer be (`Resource.create` runs its
    detectors on a `ThreadPoolExecutor`, which takes no work once the interpreter
    began joining its threads, before atexit).  `threading`'s own exit callbacks
    run then, last registered first: `concurrent.futures`' (which shuts its executors)
    is registered before this one, so runs after it."""
    import concurrent.futures.thread  # noqa: F401 - registers its exit callback now

    register = getattr(threading, "_register_atexit", None)  # CPython 3.9+
    if register is not None:
        register(_configure_at_exit)


def _configure_at_exit() -> None:
    try:
        _configure_for_waiting_work()
    except Exception as exc:  # the SDK's own failure must never reach the host
        log_once("configure at exit", exc)


def _work_waits() -> bool:
    for check in list(_waiting_checks):
        try:
            if check():
                return True
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("exit flush: what waits", exc)
    return False


def _configure_for_waiting_work() -> None:
    """Configures the SDK as its first use would where work waits in its queues and
    nothing configured it in this process: a process that only recorded engine steps
    or GPU samples, or a fork child (whose configuration is made again on first use).
    Not after `shutdown()`, nor where the SDK is disabled: nothing is made then."""
    if _tracing is not None or _shut_down is not None or _disabled is not None:
        return
    if not _work_waits():
        return
    forked_from = _forked_from
    disabled = None if forked_from is None else forked_from.get("disabled")
    if disabled if disabled is not None else _disabled_by_env():
        return
    get_tracing()


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
    cold_start_requests: int | None = None,
    cold_start_idle_s: float | None = None,
) -> Tracing:
    """Gives the configured SDK: spans go over OTLP to a tokentrace collector.

    Pass `tracer_provider` to reuse the host's own OpenTelemetry set-up, or
    `exporter` to export somewhere else (tests use an in-memory exporter).
    Calling it again replaces the previous configuration, which is shut down on a
    background thread (its last spans still leave; `shutdown()` and exit wait for it).
    `cold_start_requests` (default 1) requests after process start, or after
    `cold_start_idle_s` (default 300) idle seconds, are marked cold starts.
    """
    global _tracing, _shut_down, _disabled, _forked_from
    arguments = dict(
        endpoint=endpoint, service_name=service_name, protocol=protocol,
        record_content=record_content, resource_attributes=resource_attributes,
        exporter=exporter, disabled=disabled, cold_start_requests=cold_start_requests,
        cold_start_idle_s=cold_start_idle_s,
    )  # fmt: skip
    settings = Settings.resolve(
        endpoint,
        service_name,
        protocol,
        record_content,
        disabled,
        cold_start_requests,
        cold_start_idle_s,
    )
    owns = tracer_provider is None
    guarded: GuardedExporter | None = None
    if tracer_provider is None:
        attrs: dict[str, Any] = {"service.name": settings.service_name, "process.pid": os.getpid()}
        attrs.update(resource_attributes or {})
        # no atexit shutdown of its own: OpenTelemetry's waits up to 30 s and more on
        # a dead collector; `_at_exit` ends it within SHUTDOWN_TIMEOUT_S
        tracer_provider = TracerProvider(
            resource=HashOnceResource(Resource.create(attrs)),
            id_generator=PresetIdGenerator(),
            shutdown_on_exit=False,
        )
        # a pending request span keeps what a live one would (its events, its links)
        _pending_span.use_span_limits(tracer_provider)
        if not settings.disabled:
            # Bounded queue, export on a daemon thread: the host never waits on
            # the collector, and a dead or slow collector costs dropped spans
            # (counted, logged), not latency.
            if exporter is None:
                exporter = guarded = _make_exporter(settings)
            tracer_provider.add_span_processor(
                _export.CountingBatchSpanProcessor(
                    exporter,
                    max_queue_size=SPAN_QUEUE_SIZE,
                    schedule_delay_millis=SPAN_SCHEDULE_DELAY_MS,
                    max_export_batch_size=SPAN_BATCH_SIZE,
                )
            )
    _warn_if_lists_get_cut(tracer_provider)
    tracing = Tracing(settings, tracer_provider, owns_provider=owns, exporter=guarded)
    if owns:
        tracing.configured_with = arguments
    # At exit, what waits in the SDK's queues (finished requests, engine steps)
    # must become spans before a host provider's own atexit shutdown exports the
    # last batch: atexit runs last-registered first, so move ours after it.
    atexit.unregister(_at_exit)
    atexit.register(_at_exit)
    _flush_at_multiprocessing_exit()  # where atexit does not run: a multiprocessing child
    if _tracing is not None:
        _run_flush_hooks()  # pending data belongs to the old configuration
    with _lock:
        previous, _tracing = _tracing, tracing
        _shut_down = _disabled = _forked_from = None
    if previous is not None:
        # off the caller's thread: a dead collector must not hold up configure();
        # tt.shutdown() and exit give it the time left to send its last spans
        previous.closed = True
        _export.shutdown_in_background(previous.shutdown, "replaced-shutdown")
    return tracing


def _warn_if_lists_get_cut(provider: TracerProvider) -> None:
    """Says when an attribute length limit will cut the SDK's packed lists short.

    Token times and engine steps travel as one JSON string each (semconv.PACKED_LISTS);
    a cut string is unreadable, and the analyzer ignores it.
    """
    # OpenTelemetry has no public accessor; the limits come from SpanLimits or
    # OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT / OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT
    limits = getattr(provider, "_span_limits", None)
    limit = getattr(limits, "max_span_attribute_length", None)
    if isinstance(limit, int) and limit >= 0:
        logger.warning(
            "tokentrace: span attribute values are limited to %d characters "
            "(OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT / OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT or "
            "SpanLimits): token times and engine steps packed longer than that (a token "
            "~8 characters, a step's request ids many more) are cut short and ignored by the "
            "analyzer; unset the limit",
            limit,
        )


def get_tracing() -> Tracing:
    """Gives the current SDK state, configuring from the environment on first use.

    After `shutdown()` (until `configure()` is called again) it gives a
    configuration that exports nothing, and says so once in the log: a
    request that ends while the host shuts down must not start an exporter
    to the default endpoint.  Threads whose first requests come at once
    configure it once: the others wait for that one (no provider is made and
    shut down again on a request's thread).
    """
    tracing = _tracing
    if tracing is not None:
        return tracing
    with _lazy_lock:
        tracing = _tracing
        if tracing is not None:
            return tracing
        forked_from = _forked_from
        if forked_from is not None:  # a forked child: the parent's configuration, its own resource
            return configure(**forked_from)
        if _disabled is not None:
            return _disabled
        if _shut_down is not None:
            return _disabled_tracing(
                "used after tt.shutdown(): spans, engine steps and samples from here on are "
                "not exported (call tt.configure() to start again)"
            )
        try:
            return configure()
        except ValueError as exc:  # the environment's mistake must not fail a request
            return _disabled_tracing(f"not configured, nothing is exported: {exc}")


#: held while the first use configures the SDK from the environment (re-entrant:
#: configure() logs, and a host's log handler may be instrumented)
_lazy_lock = threading.RLock()


#: the settings of the configuration `shutdown()` ended, until `configure()` is called again
_shut_down: Settings | None = None
_disabled: Tracing | None = None


def exports_nothing() -> bool:
    """Whether nothing is exported now, known without configuring anything: after
    `shutdown()` (until `configure()`), or disabled.  For the SDK's background
    threads, which must not make a configuration (a `TracerProvider`) at exit."""
    tracing = _tracing
    if tracing is not None:
        return tracing.settings.disabled or tracing.closed
    return _shut_down is not None or _disabled is not None


def _disabled_tracing(why: str) -> Tracing:
    """Gives a configuration that records but exports nothing (made once), and says `why` once."""
    global _disabled
    with _lock:
        disabled = _disabled
        if disabled is None:
            settings = _shut_down or Settings(
                endpoint=DEFAULT_HTTP_ENDPOINT,
                service_name=_service_name_from_env(),
                protocol=PROTOCOLS[0],
                record_content=False,
                disabled=True,
            )
            # no processor: no export (and nothing to end at exit); an empty resource:
            # `Resource.create` runs its detectors on a thread pool, which fails once
            # the interpreter shuts down (a GPU sampler or request still running then)
            provider = TracerProvider(
                resource=Resource.get_empty(),
                id_generator=PresetIdGenerator(),
                shutdown_on_exit=False,
            )
            disabled = Tracing(replace(settings, disabled=True), provider, owns_provider=True)
            _disabled = disabled
    log_once(why)
    return disabled


#: the arguments of the parent's `configure()`, in a forked child that has not used the SDK yet
_forked_from: dict[str, Any] | None = None


def _after_fork_in_child() -> None:
    """A forked worker (gunicorn --preload, multiprocessing's fork) is its own
    instance: made again on first use, from the parent's `configure()`
    arguments, its resource says its own `process.pid`, and its first requests
    are cold starts.  Kept as the parent's, every worker's spans and engine
    steps would read as one instance's.  A provider the host passed in is the
    host's to remake."""
    global _tracing, _forked_from, _lock, _lazy_lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    _lazy_lock = threading.RLock()
    _export.after_fork_in_child()
    util = sys.modules.get("multiprocessing.util")
    if util is not None:
        # a multiprocessing child clears its finalizers before its target runs, then
        # calls the after-fork callbacks: the exit flush is registered there (a host
        # provider's child, configured from the parent, never calls configure())
        try:
            util.register_after_fork(_flush_at_multiprocessing_exit, _flush_at_multiprocessing_exit)
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("exit flush in a multiprocessing child", exc)
    tracing = _tracing
    if tracing is None or tracing.configured_with is None:
        return
    _tracing, _forked_from = None, tracing.configured_with
    from tokentrace.instrumentation._cold_start import tracker

    tracker.after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def shutdown() -> None:
    """Flushes and stops the exporter; safe to call twice.

    What waits in the SDK's queues is built into spans and exported first: where
    nothing configured the SDK in this process (only engine steps or GPU samples
    recorded, or a fork child that has not used it yet) it is configured for that
    as first use would, from the environment (a fork child: from the parent's
    `configure()` arguments); unless disabled.  Returns within `SHUTDOWN_TIMEOUT_S`
    (5 s) plus the flush hooks, collector down or not: what is not sent by then is
    dropped.  Until `configure()` is called again, what the SDK records is not
    exported.
    """
    global _tracing, _shut_down, _disabled
    deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
    _configure_for_waiting_work()  # queued, never configured: as first use would
    if _tracing is not None:
        _run_flush_hooks()
    with _lock:
        tracing, _tracing = _tracing, None
        if tracing is not None:
            _shut_down, _disabled = tracing.settings, None
    if tracing is not None:
        left_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
        if tracing._owns_provider:
            tracing.shutdown(left_ms)  # its processor exports what is queued, then stops
        else:
            try:
                tracing.force_flush(left_ms)
            finally:
                tracing.shutdown()
    # configurations replaced by configure() end in the background: give them the time left
    _export.wait_for_background(deadline)


def _at_exit() -> None:
    """At interpreter exit: what waits becomes spans, and leaves within `SHUTDOWN_TIMEOUT_S`."""
    try:
        shutdown()
    except Exception as exc:  # the SDK's own failure must never reach the host
        log_once("shutdown at exit", exc)


def flush_before_exit(timeout_s: float = SHUTDOWN_TIMEOUT_S) -> bool:
    """Gives whether everything the SDK holds left the process: what waits is built
    into spans and exported, as at exit, but the SDK stays configured.

    For a server's own shutdown (the ASGI middleware calls it when the app's
    lifespan shutdown completes): uvicorn then raises the SIGTERM it caught
    again and the process dies by it, so no atexit handler runs.  Not
    `shutdown()`: a host may go on using the SDK after an app's lifespan ends
    (Starlette's `TestClient` runs one per `with`, a program may serve again).
    Waits on the collector `timeout_s` at most; building the waiting spans runs
    on the caller's thread.  Nothing is configured here but where work waits that
    nothing configured (engine steps only: `shutdown()`'s case).
    """
    deadline = time.monotonic() + timeout_s
    ok = True
    _configure_for_waiting_work()
    tracing = _tracing
    if tracing is not None:
        ok = tracing.force_flush(int(timeout_s * 1000))
    # configurations replaced by configure() still end in the background
    return _export.wait_for_background(deadline) and ok


#: the pid whose multiprocessing exit runs `_at_exit` (registered once per process)
_exit_finalizer_pid: int | None = None


def _flush_at_multiprocessing_exit(_: object = None) -> None:
    """Has a multiprocessing child run the exit flush: it ends with `os._exit` after
    its target returns, so atexit never runs there (a fork child's spans, up to a
    second of them, were lost).  multiprocessing runs its own `util.Finalize`
    callbacks first (`util._exit_function`); registered once per process, and
    only where the host imported multiprocessing itself."""
    global _exit_finalizer_pid
    util = sys.modules.get("multiprocessing.util")
    process = sys.modules.get("multiprocessing.process")
    if util is None or process is None or _exit_finalizer_pid == os.getpid():
        return
    try:
        if process.parent_process() is None:
            return  # not a multiprocessing child: atexit runs
        # exit priority 0: after the host's own finalizers of higher priority, before
        # multiprocessing joins this process's children and its queues' feeder threads
        util.Finalize(None, _at_exit, exitpriority=0)
        _exit_finalizer_pid = os.getpid()
    except Exception as exc:  # the SDK's own failure must never reach the host
        log_once("exit flush in a multiprocessing child", exc)
