"""OTLP/HTTP receiver: POST /v1/traces, protobuf or JSON, optionally gzip."""

from __future__ import annotations

import json
import zlib

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tokentrace.collector.otlp import OtlpDecodeError, decode_json, decode_protobuf
from tokentrace.collector.pipeline import Pipeline

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
#: Seconds a client should wait after a 503 before retrying.
RETRY_AFTER_S = 1


class BodyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _gunzip(body: bytes, limit: int) -> bytes:
    """Decompresses with a bound on the output size (no gzip bombs)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise BodyError(400, f"invalid gzip body: {exc}") from exc
    if len(out) > limit or d.unconsumed_tail:
        raise BodyError(413, f"decompressed body exceeds {limit} bytes")
    if not d.eof:
        raise BodyError(400, "truncated gzip body")
    return out


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
            Status(code=3 if status == 400 else 14, message=message).SerializeToString(),
            status_code=status,
            media_type=PROTOBUF,
            headers=headers,
        )
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


def make_traces_endpoint(pipeline: Pipeline, max_body_bytes: int):  # type: ignore[no-untyped-def]
    async def traces(request: Request) -> Response:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        reply_type = JSON if ctype == JSON else PROTOBUF
        try:
            body = await read_body(request, max_body_bytes)
            if ctype == PROTOBUF:
                spans = decode_protobuf(body)
            elif ctype == JSON:
                try:
                    doc = json.loads(body)
                except (UnicodeDecodeError, ValueError) as exc:
                    raise OtlpDecodeError(f"invalid JSON: {exc}") from exc
                spans = decode_json(doc)
            else:
                return _error(
                    415, f"Content-Type must be {PROTOBUF} or {JSON}, not {ctype!r}", reply_type
                )
        except BodyError as exc:
            return _error(exc.status, exc.message, reply_type)
        except OtlpDecodeError as exc:
            return _error(400, str(exc), reply_type)
        if spans and not pipeline.add(spans):
            return _error(503, "tail buffer full; retry later", reply_type)
        if reply_type == JSON:
            return JSONResponse({})
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type=PROTOBUF)

    return traces


def create_http_app(pipeline: Pipeline, max_body_bytes: int) -> Starlette:
    """Gives the OTLP/HTTP ASGI app."""
    return Starlette(
        routes=[
            Route("/v1/traces", make_traces_endpoint(pipeline, max_body_bytes), methods=["POST"]),
        ]
    )

