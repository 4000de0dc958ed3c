"""OTLP/gRPC receiver: `TraceService/Export`, `MetricsService/Export` and
`LogsService/Export` (log records are counted, not stored: `otlp_logs`).

Status codes follow the OTLP spec so exporters retry what is retryable:
UNAVAILABLE under backpressure (the OTel exporters back off and retry),
INVALID_ARGUMENT for bad data (not retried), RESOURCE_EXHAUSTED for messages
over `max_body_bytes` (grpc enforces the receive limit itself), and a partial
success when only some spans were rejected.  Messages may be compressed with
gzip or deflate (what grpc takes; it refuses others, e.g. zstd, itself).

Exports beyond the worker threads wait for one, however many come at once:
grpc's own bound (`maximum_concurrent_rpcs`) answers the excess with
RESOURCE_EXHAUSTED and no RetryInfo, which OTLP clients (the OpenTelemetry
Collector) take as permanent and drop the data.  A waiting export holds no
decoded data (the message is read when a worker takes it) and, with grpc's
BDP probing off, no more of its message than HTTP/2's initial stream window
(64 KiB): with probing on, grpc grew the windows to whole messages, and 80
waiting 8 MiB exports held ~600 MB.  What a waiting export costs is then the
sender's, which holds its batch anyway; once decoded, the pipeline's bounds
apply (UNAVAILABLE + RetryInfo).

Under backpressure the UNAVAILABLE carries a `google.rpc.RetryInfo` (OTLP/gRPC
Throttling: the server tells the client how long to wait) in the places clients
read it: the standard status details (`grpc-status-details-bin`, a
`google.rpc.Status`; the OpenTelemetry Collector's Go exporter, `rpc_status`
of grpcio-status), and the `google.rpc.retryinfo-bin` trailer that the Python
OTel exporter reads.  `retry-after` (plain seconds) stays for humans and
simple clients.

The services take the raw request bytes and parse them here: grpc's own
deserializer answers a malformed message with INTERNAL "Exception
deserializing request!" (and logs a traceback), where the sender needs
INVALID_ARGUMENT and what is wrong with it.  With the write-ahead log on
(`collector/wal.py`), that message is what is logged, and OK waits until it is
on disk (UNAVAILABLE, with why, when the log cannot write it).
"""

from __future__ import annotations

from concurrent import futures
from typing import Any

import grpc
from google.protobuf.any_pb2 import Any as AnyProto
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tokentrace._loopback import host_port
from tokentrace.collector.otlp import OtlpDecodeError, parse_trace_request, spans_from_request
from tokentrace.collector.otlp_logs import logs_from_request, logs_reply, parse_logs_request
from tokentrace.collector.otlp_metrics import gpu_rows_from_request, parse_metrics_request
from tokentrace.collector.pipeline import Pipeline
from tokentrace.collector.refusals import REFUSED_WRITER_BEHIND
from tokentrace.collector.self_metrics import CollectorMetrics
from tokentrace.collector.wal import Durable, WalError
from tokentrace.collector.wal_format import KIND_METRICS_PROTOBUF, KIND_TRACES_PROTOBUF
from tokentrace.collector.writer import WriteBatch

#: Seconds a client should wait before retrying a refused export (the RetryInfo's delay).
RETRY_AFTER_S = 1
#: The longest an export waits for its write-ahead-log record to reach the disk.
WAL_WAIT_S = 30.0


TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"


def _abort_retry_later(context: grpc.ServicerContext, message: str) -> None:
    """Ends the call with UNAVAILABLE and a RetryInfo of `RETRY_AFTER_S` (backpressure)."""
    retry = RetryInfo(retry_delay=Duration(seconds=RETRY_AFTER_S))
    detail = AnyProto()
    detail.Pack(retry)
    # the Status's code and message must be the call's own (clients check)
    status = Status(code=grpc.StatusCode.UNAVAILABLE.value[0], message=message, details=[detail])
    context.set_trailing_metadata(
        (
            ("grpc-status-details-bin", status.SerializeToString()),
            ("google.rpc.retryinfo-bin", retry.SerializeToString()),
            ("retry-after", str(RETRY_AFTER_S)),
        )
    )
    context.abort(grpc.StatusCode.UNAVAILABLE, message)


def _wait_logged(durable: Durable | None, context: grpc.ServicerContext, refused: Any) -> None:
    """Returns once the export's write-ahead-log record is on disk (or there is no log);
    else ends the call with UNAVAILABLE and why (taken, not durable: the sender retries)."""
    if durable is None:
        return
    try:
        durable.wait(WAL_WAIT_S)
    except WalError as exc:
        refused.labels("grpc", "UNAVAILABLE").inc()
        _abort_retry_later(context, str(exc))


class _TraceService:
    def __init__(self, pipeline: Pipeline, metrics: CollectorMetrics) -> None:
        self._pipeline = pipeline
        self._m = metrics

    def Export(  # noqa: N802 - the generated servicer's name
        self, body: bytes, context: grpc.ServicerContext
    ) -> ExportTraceServiceResponse:
        m = self._m
        try:
            spans, rejected = spans_from_request(parse_trace_request(body))
        except (OtlpDecodeError, ValueError) as exc:
            m.exports_refused.labels("grpc", "INVALID_ARGUMENT").inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        m.spans_received.labels("grpc").inc(len(spans) + rejected.count)
        if rejected:
            m.spans_rejected.labels("grpc", "invalid").inc(rejected.count)
            if not spans:
                m.exports_refused.labels("grpc", "INVALID_ARGUMENT").inc()
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, rejected.message)
        if spans:
            why, durable = self._pipeline.offer_logged(spans, KIND_TRACES_PROTOBUF, body)
            if why is not None:
                m.spans_rejected.labels("grpc", why).inc(len(spans))
                m.exports_refused.labels("grpc", "UNAVAILABLE").inc()
                _abort_retry_later(context, self._pipeline.refusal_message(why))
            _wait_logged(durable, context, m.exports_refused)
            m.spans_accepted.labels("grpc").inc(len(spans))
        reply = ExportTraceServiceResponse()
        if rejected:
            reply.partial_success.rejected_spans = rejected.count
            reply.partial_success.error_message = rejected.message
        return reply


class _MetricsService:
    def __init__(self, pipeline: Pipeline, metrics: CollectorMetrics) -> None:
        self._pipeline = pipeline
        self._m = metrics

    def Export(  # noqa: N802 - the generated servicer's name
        self, body: bytes, context: grpc.ServicerContext
    ) -> ExportMetricsServiceResponse:
        try:
            result = gpu_rows_from_request(parse_metrics_request(body))
        except (OtlpDecodeError, ValueError) as exc:
            self._m.exports_refused.labels("grpc", "INVALID_ARGUMENT").inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if result.rows:
            taken, durable = self._pipeline.add_engine_data_logged(
                WriteBatch(gpu_samples=result.rows), KIND_METRICS_PROTOBUF, body
            )
            if not taken:
                self._m.exports_refused.labels("grpc", "UNAVAILABLE").inc()
                _abort_retry_later(context, self._pipeline.refusal_message(REFUSED_WRITER_BEHIND))
            _wait_logged(durable, context, self._m.exports_refused)
        self._m.gpu_samples.inc(len(result.rows))
        reply = ExportMetricsServiceResponse()
        if result.rejected_points:
            reply.partial_success.rejected_data_points = result.rejected_points
            reply.partial_success.error_message = result.message
        return reply


class _LogsService:
    """Takes log exports and answers that their records are not stored (`otlp_logs`)."""

    def __init__(self, metrics: CollectorMetrics) -> None:
        self._m = metrics

    def Export(  # noqa: N802 - the generated servicer's name
        self, body: bytes, context: grpc.ServicerContext
    ) -> ExportLogsServiceResponse:
        try:
            export = logs_from_request(parse_logs_request(body))
        except (OtlpDecodeError, ValueError) as exc:
            self._m.exports_refused.labels("grpc", "INVALID_ARGUMENT").inc()
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self._m.note_log_records("grpc", export.records, export.service)
        return logs_reply(export.records)


def _export_handler(service: str, export: Any) -> grpc.GenericRpcHandler:
    """The service's Export method on raw request bytes (no request_deserializer)."""
    return grpc.method_handlers_generic_handler(
        service,
        {
            "Export": grpc.unary_unary_rpc_method_handler(
                export, response_serializer=lambda reply: reply.SerializeToString()
            )
        },
    )


def start_grpc_server(
    pipeline: Pipeline,
    host: str,
    port: int,
    max_body_bytes: int,
    metrics: CollectorMetrics | None = None,
    workers: int = 4,
) -> tuple[Any, int]:
    """Starts the OTLP/gRPC server; gives it and the bound port (`port` 0 picks one).
    `workers` exports are handled at once; more wait for a worker (see the module's doc)."""
    m = metrics if metrics is not None else pipeline.metrics
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tokentrace-grpc"),
        options=[
            ("grpc.max_receive_message_length", max_body_bytes),
            ("grpc.so_reuseport", 0),
            # a waiting export then holds its initial stream window, not its whole message
            ("grpc.http2.bdp_probe", 0),
        ],
        # no maximum_concurrent_rpcs: grpc would refuse the excess without RetryInfo
    )
    server.add_generic_rpc_handlers(
        (
            _export_handler(TRACE_SERVICE, _TraceService(pipeline, m).Export),
            _export_handler(METRICS_SERVICE, _MetricsService(pipeline, m).Export),
            _export_handler(LOGS_SERVICE, _LogsService(m).Export),
        )
    )
    target = host_port(host, port)
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError as exc:  # grpcio >= 1.5x raises where older ones gave 0
        # grpc's message says no cause (its C core logged one); the caller can probe
        # the address for the OS's reason (`tokentrace.ports.check_bindable`)
        raise OSError(f"cannot serve OTLP/gRPC on {target}: {exc}") from exc
    if bound == 0:
        raise OSError(f"cannot serve OTLP/gRPC on {target}: grpc could not bind it")
    server.start()
    return server, bound
