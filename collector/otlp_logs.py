"""OTLP log exports: taken, counted and not stored.

tokentrace stores traces and GPU metrics.  Many senders export logs too, by
default (the OpenTelemetry Java agent does): a 404 or UNIMPLEMENTED is a
permanent error to them, logged at every batch.  The receivers answer success
with a partial success instead, every record rejected and the message saying
why, which OTLP tells clients not to retry; the collector counts the records
(`tokentrace_log_records_rejected_total`) and logs the first export.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from tokentrace.collector.otlp import OtlpDecodeError, _j_list, _j_obj, _j_str, parse_json_body
from tokentrace.instrumentation import semconv as sc

#: The partial success's message: why no log record is stored.
NOT_STORED = (
    "tokentrace stores traces and GPU metrics, not logs: these log records were not stored"
    " (send logs elsewhere, or turn the log exporter off: OTEL_LOGS_EXPORTER=none)"
)


@dataclass(frozen=True, slots=True)
class LogsExport:
    """What a log export held: its records and the service of its first resource."""

    records: int
    service: str


def logs_from_request(request: ExportLogsServiceRequest) -> LogsExport:
    """Gives the record count and first service of a parsed protobuf log export."""
    service = ""
    records = 0
    for rl in request.resource_logs:
        if not service:
            service = next(
                (
                    kv.value.string_value
                    for kv in rl.resource.attributes
                    if kv.key == sc.SERVICE_NAME
                ),
                "",
            )
        for sl in rl.scope_logs:
            records += len(sl.log_records)
    return LogsExport(records, service)


def parse_logs_request(body: bytes) -> ExportLogsServiceRequest:
    """Gives the parsed request, or OtlpDecodeError for bytes that are not one."""
    request = ExportLogsServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise OtlpDecodeError(f"invalid OTLP logs protobuf: {exc}") from exc
    return request


def decode_logs_protobuf(body: bytes) -> LogsExport:
    """Gives what a protobuf `ExportLogsServiceRequest` body held."""
    return logs_from_request(parse_logs_request(body))


def decode_logs_json(doc: Any) -> LogsExport:
    """Gives what an OTLP/JSON log export document held (`{}`: nothing)."""
    if not isinstance(doc, Mapping):
        raise OtlpDecodeError("OTLP JSON logs body must be an object with resourceLogs")
    service = ""
    records = 0
    for rl in _j_list(doc.get("resourceLogs"), "resourceLogs"):
        rl = _j_obj(rl, "each resourceLogs entry")
        if not service:
            resource = _j_obj(rl.get("resource"), "resource")
            for kv in _j_list(resource.get("attributes"), "attributes"):
                if isinstance(kv, Mapping) and kv.get("key") == sc.SERVICE_NAME:
                    value = _j_obj(kv.get("value"), "attribute value").get("stringValue")
                    service = _j_str(value) if isinstance(value, str) else ""
                    break
        for sl in _j_list(rl.get("scopeLogs"), "scopeLogs"):
            records += len(
                _j_list(_j_obj(sl, "each scopeLogs entry").get("logRecords"), "logRecords")
            )
    return LogsExport(records, service)


def decode_logs_json_body(body: bytes) -> LogsExport:
    """Gives what an OTLP/JSON log export request body held."""
    return decode_logs_json(parse_json_body(body))


def logs_reply(records: int) -> ExportLogsServiceResponse:
    """Gives the answer to a log export: success, every record rejected (none: empty)."""
    reply = ExportLogsServiceResponse()
    if records:
        reply.partial_success.rejected_log_records = records
        reply.partial_success.error_message = NOT_STORED
    return reply


def logs_reply_json(records: int) -> dict[str, Any]:
    """`logs_reply` in OTLP/JSON (int64 as a string)."""
    if not records:
        return {}
    return {"partialSuccess": {"rejectedLogRecords": str(records), "errorMessage": NOT_STORED}}
