"""An OTLP trace receiver on 127.0.0.1 (HTTP and gRPC) that records every export it gets.

Each export is kept as the bytes that came (`Export.body`) and written as one line of
OTLP/JSON (the specification's JSON: camelCase keys, hex trace and span ids, enums as
numbers, 64-bit integers as strings), the JSON-lines form `tokentrace import` reads.  A line
is written only when it decodes back to the exact protobuf bytes received, so a recording
loses nothing of what the engine or the client sent.
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

TRACES_PATH = "/v1/traces"
GRPC_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
# every bytes field of a trace export is an id; the JSON spec writes ids as hex
_ID_KEYS = ("traceId", "spanId", "parentSpanId")


@dataclass(frozen=True)
class Export:
    """One export as it came: its transport ("http" or "grpc"), its arrival and its body."""

    transport: str
    received_ns: int
    body: bytes

    def request(self) -> ExportTraceServiceRequest:
        """Gives the export decoded."""
        return ExportTraceServiceRequest.FromString(self.body)


def to_otlp_json(body: bytes) -> dict[str, Any]:
    """Gives the OTLP/JSON document of one protobuf trace export (hex ids)."""
    doc = json_format.MessageToDict(
        ExportTraceServiceRequest.FromString(body), use_integers_for_enums=True
    )
    for span in _spans_and_links(doc):
        for key in _ID_KEYS:
            if key in span:
                span[key] = base64.b64decode(span[key]).hex()
    return doc


def from_otlp_json(doc: dict[str, Any]) -> bytes:
    """Gives the protobuf bytes of one OTLP/JSON trace export (the inverse of `to_otlp_json`)."""
    doc = json.loads(json.dumps(doc))  # a copy to rewrite
    for span in _spans_and_links(doc):
        for key in _ID_KEYS:
            if key in span:
                span[key] = base64.b64encode(bytes.fromhex(span[key])).decode("ascii")
    request = ExportTraceServiceRequest()
    json_format.ParseDict(doc, request)
    return request.SerializeToString()


def _spans_and_links(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                yield span
                yield from span.get("links", [])


def json_line(export: Export) -> str:
    """Gives the export as one OTLP/JSON line; raises ValueError when the line would not
    decode back to the bytes received."""
    doc = to_otlp_json(export.body)
    if from_otlp_json(doc) != export.body:
        raise ValueError(f"a {export.transport} export does not round-trip through OTLP/JSON")
    return json.dumps(doc, separators=(",", ":"), sort_keys=False)


class OtlpRecorder:
    """Receives OTLP trace exports over HTTP and gRPC on free loopback ports; a context manager.

    `http_endpoint` / `grpc_endpoint` are what an exporter is pointed at."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._exports: list[Export] = []
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._http_handler())
        self._http.daemon_threads = True
        self._http_thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._grpc.add_generic_rpc_handlers([_GrpcExport(self._keep)])
        self.grpc_port = self._grpc.add_insecure_port("127.0.0.1:0")
        self.http_port = int(self._http.server_address[1])

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    def __enter__(self) -> OtlpRecorder:
        self._http_thread.start()
        self._grpc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._grpc.stop(grace=1).wait()
        self._http.shutdown()
        self._http.server_close()

    def _keep(self, transport: str, body: bytes) -> None:
        with self._lock:
            self._exports.append(Export(transport, time.time_ns(), body))
            self._lock.notify_all()

    def exports(self) -> list[Export]:
        """Gives every export received so far, in arrival order."""
        with self._lock:
            return list(self._exports)

    def take(self) -> list[Export]:
        """Gives the exports received since the last `take`, and forgets them."""
        with self._lock:
            taken, self._exports = self._exports, []
            return taken

    def wait_quiet(self, quiet_s: float, timeout_s: float = 60.0) -> bool:
        """Waits until no export has come for `quiet_s` (the senders' batches are flushed)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while time.monotonic() < deadline:
                last = self._exports[-1].received_ns if self._exports else 0
                idle_s = (time.time_ns() - last) / 1e9
                if idle_s >= quiet_s:
                    return True
                self._lock.wait(quiet_s - idle_s)
        return False

    def spans(self) -> Iterator[tuple[dict[str, Any], Any]]:
        """Gives (resource attributes, span) for every span received so far."""
        for export in self.exports():
            for rs in export.request().resource_spans:
                resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        yield resource, span

    def write(self, path: Path, exports: list[Export]) -> int:
        """Writes `exports` to `path` as OTLP/JSON lines; gives the number written."""
        lines = [json_line(e) for e in exports]
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return len(lines)

    def _http_handler(self) -> type[BaseHTTPRequestHandler]:
        keep = self._keep

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding", "").lower() == "gzip":
                    body = gzip.decompress(body)
                kind = self.headers.get("Content-Type", "")
                if self.path != TRACES_PATH or "protobuf" not in kind:
                    # an engine sending JSON or metrics here was set up otherwise than expected
                    self.send_response(415 if self.path == TRACES_PATH else 404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                keep("http", body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        return Handler


class _GrpcExport(grpc.GenericRpcHandler):
    """TraceService/Export with the body kept as bytes (no decode on the way in)."""

    def __init__(self, keep: Any) -> None:
        self._keep = keep

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler | None:
        if handler_call_details.method != GRPC_EXPORT:
            return None

        def export(body: bytes, context: Any) -> bytes:
            self._keep("grpc", body)
            return b""  # an empty ExportTraceServiceResponse: everything accepted

        return grpc.unary_unary_rpc_method_handler(export)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None
