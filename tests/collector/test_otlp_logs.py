"""OTLP log exports (the Java agent and others send them by default): taken over HTTP
(protobuf and JSON) and gRPC, answered with a partial success that rejects every record and
says why, counted in `/metrics`, logged once; never stored, never a 404 or UNIMPLEMENTED that
makes the sender log an error at every batch."""

from __future__ import annotations

import gzip
import json
import logging
from typing import Any

import grpc
import httpx
import pytest
from collector_testkit import LiveCollector
from google.rpc.status_pb2 import Status
from opentelemetry._logs import SeverityNumber
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import (
    InMemoryLogRecordExporter,
    LogRecordExportResult,
    SimpleLogRecordProcessor,
)
from opentelemetry.sdk.resources import Resource

PB = {"Content-Type": "application/x-protobuf"}
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"


def _records(n: int) -> Any:
    """Gives `n` log records made by the real SDK (what its exporters take)."""
    memory = InMemoryLogRecordExporter()
    provider = LoggerProvider(resource=Resource.create({"service.name": "java-app"}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(memory))
    logger = provider.get_logger("app")
    for i in range(n):
        logger.emit(body=f"line {i}", severity_number=SeverityNumber.INFO, severity_text="INFO")
    provider.shutdown()
    return memory.get_finished_logs()


def _rejected(live: LiveCollector, protocol: str) -> float:
    text = httpx.get(f"{live.http}/metrics").text
    key = f'tokentrace_log_records_rejected_total{{protocol="{protocol}"}} '
    return sum(float(line[len(key) :]) for line in text.splitlines() if line.startswith(key))


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_sdk_log_exporters_succeed_and_the_records_are_counted_not_stored(
    protocol: str, live: LiveCollector, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "tokentrace.collector")
    if protocol == "grpc":
        exporter: Any = GrpcLogExporter(endpoint=f"http://{live.grpc_target}", insecure=True)
    else:
        exporter = HttpLogExporter(endpoint=f"{live.http}/v1/logs")
    try:
        assert exporter.export(_records(3)) == LogRecordExportResult.SUCCESS
        assert exporter.export(_records(2)) == LogRecordExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert _rejected(live, protocol) == 5
    said = [r.getMessage() for r in caplog.records if "log export" in r.getMessage()]
    assert len(said) == 1, said  # once, not at every export
    assert "service 'java-app', 3 log records" in said[0] and "not logs" in said[0]
    for table in ("requests", "spans", "gpu_samples"):
        assert live.rows(f"SELECT count(*) FROM {table}") == [(0,)]  # noqa: S608 - fixed names


def _logs_request(n: int) -> ExportLogsServiceRequest:
    request = ExportLogsServiceRequest()
    rl = request.resource_logs.add()
    rl.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="svc")))
    for i in range(n):
        rl.scope_logs.add().log_records.add().body.string_value = f"line {i}"
    return request


def test_the_answers_reject_every_record_and_say_why(live: LiveCollector) -> None:
    body = _logs_request(4).SerializeToString()
    r = httpx.post(f"{live.http}/v1/logs", content=body, headers=PB)
    assert r.status_code == 200 and r.headers["content-type"] == PB["Content-Type"]
    partial = ExportLogsServiceResponse.FromString(r.content).partial_success
    assert partial.rejected_log_records == 4
    assert "tokentrace stores traces and GPU metrics, not logs" in partial.error_message

    r = httpx.post(
        f"{live.http}/v1/logs",
        content=gzip.compress(body),
        headers={**PB, "Content-Encoding": "gzip"},
    )
    assert ExportLogsServiceResponse.FromString(r.content).partial_success.rejected_log_records == 4

    doc = {"resourceLogs": [{"scopeLogs": [{"logRecords": [{"body": {"stringValue": "a"}}] * 3}]}]}
    r = httpx.post(f"{live.http}/v1/logs", json=doc)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json()["partialSuccess"]["rejectedLogRecords"] == "3"
    assert "not logs" in r.json()["partialSuccess"]["errorMessage"]

    with grpc.insecure_channel(live.grpc_target) as channel:
        export = channel.unary_unary(
            f"/{LOGS_SERVICE}/Export",
            request_serializer=ExportLogsServiceRequest.SerializeToString,
            response_deserializer=ExportLogsServiceResponse.FromString,
        )
        assert export(_logs_request(2), timeout=10).partial_success.rejected_log_records == 2
        assert not export(ExportLogsServiceRequest(), timeout=10).HasField("partial_success")
    assert (_rejected(live, "http"), _rejected(live, "grpc")) == (4 + 4 + 3, 2)


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (b"", PB),
        (b"{}", {"Content-Type": "application/json"}),
        (b'{"resourceLogs": []}', {"Content-Type": "application/json"}),
    ],
)
def test_an_empty_log_export_is_a_plain_success(
    body: bytes, headers: dict[str, str], live: LiveCollector
) -> None:
    r = httpx.post(f"{live.http}/v1/logs", content=body, headers=headers)
    assert r.status_code == 200
    if headers is PB:
        assert not ExportLogsServiceResponse.FromString(r.content).HasField("partial_success")
    else:
        assert r.json() == {}


@pytest.mark.slow
def test_a_bad_log_export_is_refused_like_any_export(live: LiveCollector) -> None:
    r = httpx.post(f"{live.http}/v1/logs", content=b"\xff\xff\xff", headers=PB)
    assert r.status_code == 400 and "logs" in Status.FromString(r.content).message
    r = httpx.post(
        f"{live.http}/v1/logs",
        content=json.dumps({"resourceLogs": 7}),
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400 and "resourceLogs" in r.json()["message"]
    r = httpx.post(f"{live.http}/v1/logs", content=b"x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    text = httpx.get(f"{live.http}/metrics").text
    for status in ("400", "415"):
        assert f'tokentrace_exports_refused_total{{protocol="http",status="{status}"}}' in text
