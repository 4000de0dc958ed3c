"""The standard OpenTelemetry variables, read as OpenTelemetry's own SDK reads them.

* `service.name`: `configure(service_name=)` > `TOKENTRACE_SERVICE_NAME` >
  `OTEL_SERVICE_NAME` > `service.name` in `OTEL_RESOURCE_ATTRIBUTES` > `llm-server`
  (the SDK's default once overrode the environment's `service.name`).
* Where spans and GPU samples go: `configure(endpoint=)` > `TOKENTRACE_ENDPOINT` >
  `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT` (the full URL, as written) >
  `OTEL_EXPORTER_OTLP_ENDPOINT` (+ `/v1/traces`, `/v1/metrics`) > the default; the
  per-signal variable was ignored.  Protocols likewise.

Where data goes is shown by a real OTLP/HTTP receiver on 127.0.0.1, reached only
through the variable under test, while the others name a port nothing listens on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tt_testkit import OtlpHttpSink, free_port

from tests.instrumentation.test_gpu_sampler import FakeNvml
from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _gpu
from tokentrace.instrumentation._runtime import Runtime

#: every variable the SDK's configuration reads: each test sets its own
_ENV = (
    "TOKENTRACE_ENDPOINT",
    "TOKENTRACE_SERVICE_NAME",
    "TOKENTRACE_PROTOCOL",
    "TOKENTRACE_DISABLED",
    "TOKENTRACE_RECORD_CONTENT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
)


class Receiver(OtlpHttpSink):
    """A sink that answers 200 on every path: where the SDK sent what."""

    def trace_services(self) -> set[str]:
        """The `service.name` of every resource in the spans it was sent."""
        requests = [ExportTraceServiceRequest.FromString(body) for body in self.bodies()]
        return {_service(rs.resource) for r in requests for rs in r.resource_spans}

    def metric_services(self) -> set[str]:
        """The `service.name` of every resource in the metrics it was sent."""
        requests = [ExportMetricsServiceRequest.FromString(body) for body in self.bodies()]
        return {_service(rm.resource) for r in requests for rm in r.resource_metrics}


def _service(resource: Any) -> str:
    attrs = {kv.key: kv.value.string_value for kv in resource.attributes}
    return attrs.get("service.name", "")


def _nowhere() -> str:
    """A URL on 127.0.0.1 where nothing listens (free a moment ago)."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, unconfigured: Runtime) -> None:
    """No configuration and none of the variables at the start; none left behind."""
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)


def _one_request() -> tt.Tracing:
    """Serves one request (configuring from the environment on first use) and flushes."""
    with tt.request(model="m") as req:
        req.token()
    tracing = tt.get_tracing()
    assert tracing.force_flush(10_000), "spans did not reach the collector"
    return tracing


# ---- where spans go ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("how", ["first use", "configure()"])
def test_traces_endpoint_is_used_as_written_over_the_general_one(
    how: str, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the OpenTelemetry Operator and many Helm charts set: the full URL, any path."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{receiver.url}/otlp/spans\n")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", _nowhere())
    if how == "configure()":
        tt.configure(service_name="per-signal")
    tracing = _one_request()
    assert tracing.settings.traces_endpoint == f"{receiver.url}/otlp/spans"
    assert tracing.exporter is not None and tracing.exporter.dropped == 0
    assert receiver.paths() == {"/otlp/spans"}  # nothing appended, nothing taken off


@pytest.mark.slow
def test_general_endpoint_gets_the_traces_path(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"{receiver.url}/")
    tracing = _one_request()
    assert tracing.settings.endpoint == receiver.url
    assert receiver.paths() == {"/v1/traces"}


@pytest.mark.slow
@pytest.mark.parametrize("own", ["TOKENTRACE_ENDPOINT", "configure(endpoint=)"])
def test_own_endpoint_beats_the_otel_variables(
    own: str, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """explicit argument > TOKENTRACE_ENDPOINT > OTEL per-signal > OTEL general."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{_nowhere()}/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", _nowhere())
    if own == "TOKENTRACE_ENDPOINT":
        monkeypatch.setenv("TOKENTRACE_ENDPOINT", receiver.url)
    else:
        monkeypatch.setenv("TOKENTRACE_ENDPOINT", _nowhere())
        tt.configure(endpoint=receiver.url)
    tracing = _one_request()
    assert tracing.settings.traces_endpoint == f"{receiver.url}/v1/traces"
    assert receiver.paths() == {"/v1/traces"}


def test_traces_protocol_beats_the_general_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    settings = tt.configure(disabled=True).settings
    assert (settings.protocol, settings.traces_endpoint) == ("grpc", "http://127.0.0.1:4317")
    # GPU samples (metrics) keep the general protocol and its default endpoint
    assert (settings.metrics_protocol, settings.metrics_endpoint) == (
        "http/protobuf",
        "http://127.0.0.1:4318/v1/metrics",
    )
    # ... and TOKENTRACE_PROTOCOL, then the argument, beat both
    monkeypatch.setenv("TOKENTRACE_PROTOCOL", "http/protobuf")
    assert tt.configure(disabled=True).settings.protocol == "http/protobuf"
    monkeypatch.setenv("TOKENTRACE_PROTOCOL", "grpc")
    settings = tt.configure(protocol="http/protobuf", disabled=True).settings
    assert (settings.protocol, settings.metrics_protocol) == ("http/protobuf", "http/protobuf")


# ---- where GPU samples go --------------------------------------------------------------


@pytest.mark.slow
def test_metrics_endpoint_is_used_as_written_for_gpu_samples(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", f"{receiver.url}/otlp/gauges")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{_nowhere()}/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", _nowhere())
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=chat-api")
    tt.configure(exporter=InMemorySpanExporter())
    sampler = _gpu.GpuSampler(FakeNvml(), interval_s=0.01, export=False)
    try:
        sampler.sample_once()
        assert sampler.export_now() == 2
    finally:
        sampler.stop()
    assert receiver.paths() == {"/otlp/gauges"}
    # the spans' resource: the collector keys GPU samples by its service.name
    assert receiver.metric_services() == {"chat-api"}


# ---- service.name ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "service_name", "expected"),
    [
        ({}, None, "llm-server"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=chat-api,deployment.environment=prod"},
         None, "chat-api"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=chat%20api"}, None, "chat api"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "malformed, service.name = chat-api ,"}, None, "chat-api"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=chat-api,deployment.environment=prod",
          "OTEL_SERVICE_NAME": "svc-env"}, None, "svc-env"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=chat-api", "OTEL_SERVICE_NAME": "svc-env",
          "TOKENTRACE_SERVICE_NAME": "tt-env"}, None, "tt-env"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=chat-api", "OTEL_SERVICE_NAME": "svc-env",
          "TOKENTRACE_SERVICE_NAME": "tt-env"}, "explicit", "explicit"),
    ],
)  # fmt: skip
def test_service_name_precedence_on_exported_spans(
    env: dict[str, str], service_name: str | None, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    exporter = InMemorySpanExporter()
    tracing = tt.configure(service_name=service_name, exporter=exporter)
    _one_request()
    spans = exporter.get_finished_spans()
    assert spans
    assert {s.resource.attributes["service.name"] for s in spans} == {expected}
    assert tracing.settings.service_name == expected
    if "deployment.environment=prod" in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        assert spans[0].resource.attributes["deployment.environment"] == "prod"  # kept


@pytest.mark.slow
def test_service_name_from_resource_attributes_reaches_the_collector_on_first_use(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reviewer's set-up: no configure(), all from the environment, over the wire."""
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "service.name=chat-api,deployment.environment=prod"
    )
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{receiver.url}/v1/traces")
    _one_request()
    assert receiver.trace_services() == {"chat-api"}


def test_a_disabled_configuration_names_the_environment_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A configuration that exports nothing (here an environment mistake) names the
    service as the environment does, too."""
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=chat-api")
    monkeypatch.setenv("TOKENTRACE_ENDPOINT", "http://")  # a mistake: nothing is exported
    with tt.request(model="m"):
        pass
    settings = tt.get_tracing().settings
    assert settings.disabled
    assert settings.service_name == "chat-api"


def test_serve_stores_the_environment_service_name(serve, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """End to end: a real `tokentrace serve`, reached through the per-signal variable
    (the general one names nowhere), stores the requests under `chat-api`."""
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=chat-api")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{serve.otlp_http}/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", _nowhere())
    with tt.request(request_id="env-named", model="tiny") as req:
        req.token()
    assert tt.get_tracing().force_flush(10_000)
    tt.shutdown()
    serve.stop()
    assert serve.rows("SELECT request_id, service FROM requests") == [("env-named", "chat-api")]
