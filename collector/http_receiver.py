"""OTLP/HTTP receiver: POST /v1/traces, /v1/metrics and /v1/logs (protobuf or JSON;
gzip, deflate, zstd or uncompressed), the collector's Prometheus `/metrics` and its
readiness `/readyz`.

Answers follow the OTLP/HTTP spec: the reply is in the request's content type, an
error's body a `google.rpc.Status` (404 and 405 included); 400 for bad data, 413
over the size bound, 415 for an unknown type or encoding, 503 + Retry-After under
backpressure, 200 with `partialSuccess` when some spans were rejected (and for
every log export: log records are counted, not stored, `otlp_logs`).  A path may
end in `/`: a redirect would not do, OkHttp does not follow a 307 for a POST.

Big bodies are decompressed and decoded off the event loop (a decode worker, else
a thread), so one big export does not stall the others and `/readyz`.

With the write-ahead log on (`collector/wal.py`), a trace or metrics export is answered
200 only once its body is on disk; one the log could not write is answered 503 with why.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tokentrace._loopback import foreign_host, is_loopback, refusal_message
from tokentrace.analyzer.spans import Span
from tokentrace.collector.content_encoding import BodyError, check_encoding, decompress
from tokentrace.collector.decode_pool import OFFLOAD_MIN_BYTES, DecodePool
from tokentrace.collector.otlp import (
    OtlpDecodeError,
    Rejected,
    decode_json_body,
    decode_protobuf_partial,
)
from tokentrace.collector.otlp_logs import (
    LogsExport,
    decode_logs_json_body,
    decode_logs_protobuf,
    logs_reply,
    logs_reply_json,
)
from tokentrace.collector.otlp_metrics import decode_metrics_json_body, decode_metrics_protobuf
from tokentrace.collector.packed import PackedTrace, span_count
from tokentrace.collector.pipeline import Pipeline
from tokentrace.collector.refusals import REFUSED_WRITER_BEHIND
from tokentrace.collector.self_metrics import CollectorMetrics
from tokentrace.collector.wal import Durable, WalError
from tokentrace.collector.wal_format import (
    KIND_METRICS_JSON,
    KIND_METRICS_PROTOBUF,
    KIND_TRACES_JSON,
    KIND_TRACES_PROTOBUF,
)
from tokentrace.collector.writer import WriteBatch

T = TypeVar("T")

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
#: Seconds a client should wait after a 503 before retrying.
RETRY_AFTER_S = 1


#: google.rpc.Code carried in error bodies (protobuf and JSON alike), by HTTP status
#: (404 and 405: UNIMPLEMENTED, as gRPC maps them).
_GRPC_CODE = {400: 3, 403: 7, 404: 12, 405: 12, 413: 8, 415: 3, 429: 8, 503: 14}

#: Bodies from this size on are decompressed and decoded off the event loop.
OFF_LOOP_MIN_BYTES = OFFLOAD_MIN_BYTES


async def _off_loop(work: Callable[[bytes], T], body: bytes) -> T:
    """Gives `work(body)`, run in a thread when the body is big (the loop stays free)."""
    if len(body) < OFF_LOOP_MIN_BYTES:
        return work(body)
    return await asyncio.to_thread(work, body)


async def read_body(request: Request, limit: int) -> bytes:
    """Gives the request body, decompressed, within `limit` bytes (before and after)."""
    coding = check_encoding(request.headers.get("content-encoding", ""))
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyError(413, f"body exceeds {limit} bytes")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyError(413, f"body exceeds {limit} bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    if not coding:
        return body
    return await _off_loop(functools.partial(decompress, coding=coding, limit=limit), body)


def _error(status: int, message: str, content_type: str) -> Response:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else None
    if content_type == PROTOBUF:
        # OTLP says errors carry a google.rpc.Status; its message is what matters
        from google.rpc.status_pb2 import Status

        return Response(
            Status(code=_GRPC_CODE.get(status, 2), message=message).SerializeToString(),
            status_code=status,
            media_type=PROTOBUF,
            headers=headers,
        )
    # the same google.rpc.Status in its JSON form: `code` is the gRPC code, not the HTTP one
    return JSONResponse(
        {"code": _GRPC_CODE.get(status, 2), "message": message}, status_code=status, headers=headers
    )


def _unreadable(exc: BodyError | OtlpDecodeError, reply_type: str, refused: Any) -> Response:
    """Answers an export whose body could not be read (`BodyError`: its status) or
    decoded (400), counted in `refused` (`tokentrace_exports_refused_total`)."""
    status, message = (exc.status, exc.message) if isinstance(exc, BodyError) else (400, str(exc))
    refused.labels("http", str(status)).inc()
    return _error(status, message, reply_type)


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


def _check_content_type(ctype: str) -> None:
    if ctype not in (PROTOBUF, JSON):
        raise BodyError(415, f"Content-Type must be {PROTOBUF} or {JSON}, not {ctype!r}")


async def _decode(
    request: Request, max_body_bytes: int, ctype: str, proto: Callable[[bytes], T],
    json_body: Callable[[bytes], T],
) -> T:  # fmt: skip
    """Reads and decodes a body; BodyError / OtlpDecodeError say what is wrong."""
    return (await _decode_body(request, max_body_bytes, ctype, proto, json_body))[0]


async def _decode_body(
    request: Request, max_body_bytes: int, ctype: str, proto: Callable[[bytes], T],
    json_body: Callable[[bytes], T],
) -> tuple[T, bytes]:  # fmt: skip
    """`_decode`, and the (decompressed) body it decoded."""
    _check_content_type(ctype)
    body = await read_body(request, max_body_bytes)
    return await _off_loop(proto if ctype == PROTOBUF else json_body, body), body


async def _unlogged(durable: Durable | None) -> str | None:
    """Waits until the export's write-ahead-log record is on disk; gives why it is not
    (None: durable, or no log)."""
    if durable is None:
        return None
    try:
        await durable.wait_async()
    except WalError as exc:
        return str(exc)
    return None


def _partial(reply_type: str, rejected: int, message: str, signal: str) -> Response:
    """Gives the OTLP success response, with partial success when something was rejected."""
    if reply_type == JSON:
        if not rejected:
            return JSONResponse({})
        key = "rejectedSpans" if signal == "traces" else "rejectedDataPoints"
        # OTLP/JSON writes int64 as strings
        return JSONResponse({"partialSuccess": {key: str(rejected), "errorMessage": message}})
    if signal == "traces":
        traces_reply = ExportTraceServiceResponse()
        if rejected:
            traces_reply.partial_success.rejected_spans = rejected
            traces_reply.partial_success.error_message = message
        return Response(traces_reply.SerializeToString(), media_type=PROTOBUF)
    metrics_reply = ExportMetricsServiceResponse()
    if rejected:
        metrics_reply.partial_success.rejected_data_points = rejected
        metrics_reply.partial_success.error_message = message
    return Response(metrics_reply.SerializeToString(), media_type=PROTOBUF)


def make_traces_endpoint(
    pipeline: Pipeline,
    max_body_bytes: int,
    metrics: CollectorMetrics | None = None,
    decoder: DecodePool | None = None,
) -> Callable[[Request], Awaitable[Response]]:
    m = metrics if metrics is not None else pipeline.metrics

    async def decode(
        request: Request, ctype: str
    ) -> tuple[tuple[list[Span] | list[PackedTrace], Rejected], bytes]:
        if decoder is None:
            return await _decode_body(
                request, max_body_bytes, ctype, decode_protobuf_partial, decode_json_body
            )
        _check_content_type(ctype)
        body = await read_body(request, max_body_bytes)
        return await decoder.decode(body, json_body=ctype == JSON), body

    refused = m.exports_refused
    received = m.spans_received.labels("http")
    accepted = m.spans_accepted.labels("http")

    async def traces(request: Request) -> Response:
        ctype = _content_type(request)
        reply_type = JSON if ctype == JSON else PROTOBUF
        try:
            (spans, rejected), body = await decode(request, ctype)
            n_spans = span_count(spans)
        except (BodyError, OtlpDecodeError) as exc:
            return _unreadable(exc, reply_type, refused)
        received.inc(n_spans + rejected.count)
        if rejected:
            m.spans_rejected.labels("http", "invalid").inc(rejected.count)
            if not spans:  # nothing usable at all: a bad request, not a partial success
                refused.labels("http", "400").inc()
                return _error(400, rejected.message, reply_type)
        if spans:
            kind = KIND_TRACES_JSON if ctype == JSON else KIND_TRACES_PROTOBUF
            why, durable = pipeline.offer_logged(spans, kind, body)
            if why is not None:
                m.spans_rejected.labels("http", why).inc(n_spans)
                refused.labels("http", "503").inc()
                return _error(503, pipeline.refusal_message(why), reply_type)
            unlogged = await _unlogged(durable)
            if unlogged is not None:  # taken, but not durable: the sender must retry
                refused.labels("http", "503").inc()
                return _error(503, unlogged, reply_type)
            accepted.inc(n_spans)
        return _partial(reply_type, rejected.count, rejected.message, "traces")

    return traces


def make_metrics_endpoint(
    pipeline: Pipeline, max_body_bytes: int, metrics: CollectorMetrics | None = None
) -> Callable[[Request], Awaitable[Response]]:
    m = metrics if metrics is not None else pipeline.metrics

    async def otlp_metrics(request: Request) -> Response:
        ctype = _content_type(request)
        reply_type = JSON if ctype == JSON else PROTOBUF
        try:
            result, body = await _decode_body(
                request, max_body_bytes, ctype, decode_metrics_protobuf, decode_metrics_json_body
            )
        except (BodyError, OtlpDecodeError) as exc:
            return _unreadable(exc, reply_type, m.exports_refused)
        if result.rows:
            kind = KIND_METRICS_JSON if ctype == JSON else KIND_METRICS_PROTOBUF
            batch = WriteBatch(gpu_samples=result.rows)
            taken, durable = pipeline.add_engine_data_logged(batch, kind, body)
            if not taken:
                m.exports_refused.labels("http", "503").inc()
                return _error(503, pipeline.refusal_message(REFUSED_WRITER_BEHIND), reply_type)
            unlogged = await _unlogged(durable)
            if unlogged is not None:
                m.exports_refused.labels("http", "503").inc()
                return _error(503, unlogged, reply_type)
        m.gpu_samples.inc(len(result.rows))
        return _partial(reply_type, result.rejected_points, result.message, "metrics")

    return otlp_metrics


def make_logs_endpoint(
    max_body_bytes: int, metrics: CollectorMetrics
) -> Callable[[Request], Awaitable[Response]]:
    """`POST /v1/logs`: read and counted like any export, answered with a partial
    success that rejects every record (`otlp_logs`); nothing is stored."""

    async def otlp_logs(request: Request) -> Response:
        ctype = _content_type(request)
        reply_type = JSON if ctype == JSON else PROTOBUF
        try:
            export: LogsExport = await _decode(
                request, max_body_bytes, ctype, decode_logs_protobuf, decode_logs_json_body
            )
        except (BodyError, OtlpDecodeError) as exc:
            return _unreadable(exc, reply_type, metrics.exports_refused)
        metrics.note_log_records("http", export.records, export.service)
        if reply_type == JSON:
            return JSONResponse(logs_reply_json(export.records))
        return Response(logs_reply(export.records).SerializeToString(), media_type=PROTOBUF)

    return otlp_logs


def make_not_routed_handler(
    metrics: CollectorMetrics, export_paths: Sequence[str]
) -> Callable[[Request, Exception], Awaitable[Response]]:
    """Answers a path without an endpoint (404) or a method it does not take (405)
    as OTLP wants every 4xx answered: a `google.rpc.Status`, in JSON for a JSON
    request; a 404 names the `export_paths`.  A POST counts as a refused export (a
    sender pointed at a wrong path)."""

    async def not_routed(request: Request, exc: Exception) -> Response:
        status, headers = 404, {}
        if isinstance(exc, HTTPException):
            status, headers = exc.status_code, dict(exc.headers or {})
        path = request.scope["path"]  # as sent: `url.path` reads "//v1/x" as a host
        if status == 405:
            message = f"{request.method} is not allowed on {path}; allowed: {headers.get('Allow')}"
        else:
            message = f"no endpoint at {path}: OTLP exports go to POST " + ", ".join(export_paths)
        if request.method == "POST":
            metrics.exports_refused.labels("http", str(status)).inc()
        response = _error(status, message, JSON if _content_type(request) == JSON else PROTOBUF)
        response.headers.update(headers)  # 405's Allow
        return response

    return not_routed


def make_readiness_endpoint(pipeline: Pipeline) -> Callable[[Request], Awaitable[Response]]:
    """`GET /readyz`, unauthenticated: 200 `{"status": "ready"}` while exports are
    taken, 503 `{"status": "unavailable", "reason": ...}` while they would be
    refused: the store takes no writes (disk full, ...), the writer queue or
    the tail buffer is full."""

    async def readyz(request: Request) -> Response:
        reason = pipeline.readiness()
        if reason is None:
            note = pipeline.readiness_note()  # a shard's lake unreachable, within its bound
            return JSONResponse({"status": "ready", **({"lake": note} if note else {})})
        return JSONResponse(
            {"status": "unavailable", "reason": reason},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )

    return readyz


def make_prometheus_endpoint(metrics: CollectorMetrics) -> Callable[[Request], Awaitable[Response]]:
    async def prometheus(request: Request) -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    return prometheus


class LoopbackHostOnly:
    """Refuses (403, in the request's content type) a request whose `Host` names another
    machine: a web page that re-points its own name at 127.0.0.1 (DNS rebinding)
    could otherwise post made-up traces into the store (`tokentrace._loopback`).

    Plain ASGI, not a Starlette `BaseHTTPMiddleware`: every export passes
    through it, and it reads one header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            host = headers.get(b"host")
            header = None if host is None else host.decode("latin-1")
            if foreign_host(header):
                ctype = headers.get(b"content-type", b"").decode("latin-1").split(";")[0]
                message = refusal_message(header or "", "the OTLP/HTTP receiver", "--otlp-host")
                await _error(403, message, ctype.strip().lower())(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_http_app(
    pipeline: Pipeline,
    max_body_bytes: int,
    metrics: CollectorMetrics | None = None,
    decoder: DecodePool | None = None,
    bind_host: str = "127.0.0.1",
) -> Starlette:
    """Gives the OTLP/HTTP ASGI app: /v1/traces, /v1/metrics, /v1/logs, Prometheus
    /metrics and the readiness probe /readyz.

    With a `decoder`, big trace exports are decoded in its worker processes.
    Bound to a loopback `bind_host` (the address its own server binds:
    `--otlp-host`, not the web UI's), it answers only requests whose `Host`
    names this machine (`LoopbackHostOnly`)."""
    m = metrics if metrics is not None else pipeline.metrics
    exports = {
        "/v1/traces": make_traces_endpoint(pipeline, max_body_bytes, m, decoder),
        "/v1/metrics": make_metrics_endpoint(pipeline, max_body_bytes, m),
        "/v1/logs": make_logs_endpoint(max_body_bytes, m),
    }
    not_routed = make_not_routed_handler(m, tuple(exports))
    return Starlette(
        routes=[
            *(Route(path, endpoint, methods=["POST"]) for path, endpoint in exports.items()),
            # a trailing slash is served, not redirected (no 307 for a POST)
            *(Route(path + "/", endpoint, methods=["POST"]) for path, endpoint in exports.items()),
            Route("/metrics", make_prometheus_endpoint(m), methods=["GET"]),
            Route("/readyz", make_readiness_endpoint(pipeline), methods=["GET"]),
        ],
        middleware=[Middleware(LoopbackHostOnly)] if is_loopback(bind_host) else [],
        exception_handlers={404: not_routed, 405: not_routed},
    )
