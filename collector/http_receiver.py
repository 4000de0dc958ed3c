"""OTLP/HTTP receiver: POST /v1/traces and /v1/metrics (protobuf or JSON, optionally
gzip), the collector's Prometheus `/metrics` and its readiness `/readyz`.

Answers follow the OTLP/HTTP spec: the reply is in the request's content type;
400 for bad data, 413 over the size bound, 415 for an unknown type or encoding,
503 + Retry-After under backpressure, 200 with `partialSuccess` when some spans
were rejected.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tokentrace._loopback import foreign_host, is_loopback, refusal_message
from tokentrace.analyzer.spans import Span
from tokentrace.collector.decode_pool import DecodePool
from tokentrace.collector.otlp import (
    OtlpDecodeError,
    Rejected,
    decode_json_partial,
    decode_protobuf_partial,
)
from tokentrace.collector.otlp_metrics import decode_metrics_json, decode_metrics_protobuf
from tokentrace.collector.packed import PackedTrace, span_count
from tokentrace.collector.pipeline import REFUSED_WRITER_BEHIND, Pipeline
from tokentrace.collector.self_metrics import CollectorMetrics
from tokentrace.collector.writer import WriteBatch

T = TypeVar("T")

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
#: Seconds a client should wait after a 503 before retrying.
RETRY_AFTER_S = 1


#: google.rpc.Code carried in error bodies (protobuf and JSON alike), by HTTP status.
_GRPC_CODE = {400: 3, 403: 7, 413: 8, 415: 3, 429: 8, 503: 14}


class BodyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _gunzip(body: bytes, limit: int) -> bytes:
    """Decompresses with a bound on the output size (no gzip bombs).

    A gzip body may hold several members (RFC 1952; the OTel Collector's Go
    reader takes them all): each is read, so none is silently dropped, and
    bytes after the last one that are not a member are an error."""
    out = bytearray()
    rest = body
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            # max_length >= 1 here: 0 would mean "no bound"
            out += d.decompress(rest, limit + 1 - len(out))
        except zlib.error as exc:
            what = "data after the gzip stream" if out else "gzip body"
            raise BodyError(400, f"invalid {what}: {exc}") from exc
        if len(out) > limit or d.unconsumed_tail:
            raise BodyError(413, f"decompressed body exceeds {limit} bytes")
        if not d.eof:
            raise BodyError(400, "truncated gzip body")
        rest = d.unused_data
        if not rest:
            return bytes(out)


async def read_body(request: Request, limit: int) -> bytes:
    """Gives the request body, decompressed, within `limit` bytes."""
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
    encoding = request.headers.get("content-encoding", "").lower()
    if encoding == "gzip":
        body = _gunzip(body, limit)
    elif encoding not in ("", "identity"):
        raise BodyError(415, f"unsupported Content-Encoding {encoding!r}")
    return body


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


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()


async def _decode(
    request: Request, max_body_bytes: int, ctype: str, proto: Callable[[bytes], T],
    json_doc: Callable[[Any], T],
) -> T:  # fmt: skip
    """Reads and decodes a body; BodyError / OtlpDecodeError say what is wrong."""
    if ctype not in (PROTOBUF, JSON):
        raise BodyError(415, f"Content-Type must be {PROTOBUF} or {JSON}, not {ctype!r}")
    body = await read_body(request, max_body_bytes)
    if ctype == PROTOBUF:
        return proto(body)
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise OtlpDecodeError(f"invalid JSON: {exc}") from exc
    return json_doc(doc)


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
    ) -> tuple[list[Span] | list[PackedTrace], Rejected]:
        if decoder is not None and ctype == PROTOBUF:
            return await decoder.decode(await read_body(request, max_body_bytes))
        return await _decode(
            request, max_body_bytes, ctype, decode_protobuf_partial, decode_json_partial
        )

    refused = m.exports_refused
    received = m.spans_received.labels("http")
    accepted = m.spans_accepted.labels("http")

    async def traces(request: Request) -> Response:
        ctype = _content_type(request)
        reply_type = JSON if ctype == JSON else PROTOBUF
        try:
            spans, rejected = await decode(request, ctype)
            n_spans = span_count(spans)
        except BodyError as exc:
            refused.labels("http", str(exc.status)).inc()
            return _error(exc.status, exc.message, reply_type)
        except OtlpDecodeError as exc:
            refused.labels("http", "400").inc()
            return _error(400, str(exc), reply_type)
        received.inc(n_spans + rejected.count)
        if rejected:
            m.spans_rejected.labels("http", "invalid").inc(rejected.count)
            if not spans:  # nothing usable at all: a bad request, not a partial success
                refused.labels("http", "400").inc()
                return _error(400, rejected.message, reply_type)
        if spans:
            why = pipeline.offer(spans)
            if why is not None:
                m.spans_rejected.labels("http", why).inc(n_spans)
                refused.labels("http", "503").inc()
                return _error(503, pipeline.refusal_message(why), reply_type)
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
            result = await _decode(
                request, max_body_bytes, ctype, decode_metrics_protobuf, decode_metrics_json
            )
        except BodyError as exc:
            m.exports_refused.labels("http", str(exc.status)).inc()
            return _error(exc.status, exc.message, reply_type)
        except OtlpDecodeError as exc:
            m.exports_refused.labels("http", "400").inc()
            return _error(400, str(exc), reply_type)
        if result.rows and not pipeline.add_engine_data(WriteBatch(gpu_samples=result.rows)):
            m.exports_refused.labels("http", "503").inc()
            return _error(503, pipeline.refusal_message(REFUSED_WRITER_BEHIND), reply_type)
        m.gpu_samples.inc(len(result.rows))
        return _partial(reply_type, result.rejected_points, result.message, "metrics")

    return otlp_metrics


def make_readiness_endpoint(pipeline: Pipeline) -> Callable[[Request], Awaitable[Response]]:
    """`GET /readyz`, unauthenticated: 200 `{"status": "ready"}` while exports are
    taken, 503 `{"status": "unavailable", "reason": ...}` while they would be
    refused: the store takes no writes (disk full, ...), the writer queue or
    the tail buffer is full."""

    async def readyz(request: Request) -> Response:
        reason = pipeline.readiness()
        if reason is None:
            return JSONResponse({"status": "ready"})
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
    """Gives the OTLP/HTTP ASGI app: /v1/traces, /v1/metrics, Prometheus /metrics
    and the readiness probe /readyz.

    With a `decoder`, big protobuf trace exports are decoded in its worker
    processes.  Bound to a loopback `bind_host` (the address its own server
    binds: `--otlp-host`, not the web UI's), it answers only requests whose
    `Host` names this machine (`LoopbackHostOnly`)."""
    m = metrics if metrics is not None else pipeline.metrics
    traces = make_traces_endpoint(pipeline, max_body_bytes, m, decoder)
    return Starlette(
        routes=[
            Route("/v1/traces", traces, methods=["POST"]),
            Route(
                "/v1/metrics", make_metrics_endpoint(pipeline, max_body_bytes, m), methods=["POST"]
            ),
            Route("/metrics", make_prometheus_endpoint(m), methods=["GET"]),
            Route("/readyz", make_readiness_endpoint(pipeline), methods=["GET"]),
        ],
        middleware=[Middleware(LoopbackHostOnly)] if is_loopback(bind_host) else [],
    )
