"""A test-side stand-in for the OpenTelemetry Collector's `loadbalancing` exporter with
`routing_key: traceID`: it takes OTLP/HTTP protobuf exports, splits their spans by trace id
onto N backends and posts each part to its backend's `/v1/traces`.

What it copies from the exporter (docs/scale-out.md):
- a hash ring: each backend holds `POINTS` points on a ring of CRC-32 values and a trace
  goes to the first point at or after the CRC-32 of its id, so every span of a trace reaches
  one backend, and a backend removed moves only the traces it held;
- each part keeps its resource and scope (the exporter splits an export into one batch per
  backend, the rest of the message as it came);
- metrics are never routed by trace id (the exporter refuses `traceID` for metrics): each
  resource's metrics go to one backend by its `service.name`, the exporter's default
  (`routing_key: service`);
- each backend's part is retried on its own while that backend answers 503/429, as the
  exporter's per-backend `retry_on_failure` does.

    router = OtlpRouter(["http://127.0.0.1:4318", "http://127.0.0.1:4319"])
    router.route("/v1/traces", body)   # or, as a server: with router.serving() as url: ...
"""

from __future__ import annotations

import bisect
import http.client
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

PB = {"Content-Type": "application/x-protobuf"}
#: points each backend holds on the ring (the exporter's own number)
POINTS = 100
#: how long one part is retried while its backend answers 503/429
RETRY_FOR_S = 60.0


class OtlpRouter:
    """Splits OTLP/HTTP exports by trace id onto `backends` (base URLs of `tokentrace
    serve`'s OTLP/HTTP port) and posts each part to its backend."""

    def __init__(self, backends: list[str]) -> None:
        if not backends:
            raise ValueError("a router needs at least one backend")
        self.backends = list(backends)
        ring = sorted(
            (zlib.crc32(f"{backend}-{i}".encode()), b)
            for b, backend in enumerate(self.backends)
            for i in range(POINTS)
        )
        self._ring_points = [point for point, _ in ring]
        self._ring_backends = [b for _, b in ring]
        #: spans and exports posted to each backend, for a test to read
        self.spans_sent = [0] * len(backends)
        self.posts = [0] * len(backends)
        self._lock = threading.Lock()

    def backend_of(self, key: bytes) -> int:
        """Gives the index of the backend that owns `key` (a trace id, or a service name)."""
        at = bisect.bisect_left(self._ring_points, zlib.crc32(key)) % len(self._ring_points)
        return self._ring_backends[at]

    def split_traces(self, body: bytes) -> dict[int, ExportTraceServiceRequest]:
        """Gives one export per backend: the spans of the traces it owns, under a copy of
        the resource and scope they came with."""
        parts: dict[int, ExportTraceServiceRequest] = {}
        for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
            # (backend, scope index) -> that backend's copy of this scope
            copies: dict[tuple[int, int], ScopeSpans] = {}
            for s, ss in enumerate(rs.scope_spans):
                for span in ss.spans:
                    b = self.backend_of(span.trace_id)
                    if (b, s) not in copies:
                        part = parts.setdefault(b, ExportTraceServiceRequest())
                        copies[(b, s)] = _scope_copy(part, rs, ss)
                    copies[(b, s)].spans.add().CopyFrom(span)
        return parts

    def split_metrics(self, body: bytes) -> dict[int, ExportMetricsServiceRequest]:
        """Gives one export per backend: each resource's metrics whole, to the backend of its
        `service.name`."""
        parts: dict[int, ExportMetricsServiceRequest] = {}
        for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
            service = next(
                (a.value.string_value for a in rm.resource.attributes if a.key == "service.name"),
                "",
            )
            b = self.backend_of(service.encode())
            parts.setdefault(b, ExportMetricsServiceRequest()).resource_metrics.add().CopyFrom(rm)
        return parts

    def route(self, path: str, body: bytes) -> int:
        """Splits one export and posts each part to its backend (retried while it answers
        503/429); gives 200 when every part was taken, else the first other status."""
        parts: dict[int, tuple[bytes, int]]  # backend -> (its part, spans in it)
        if path == "/v1/traces":
            parts = {
                b: (
                    part.SerializeToString(),
                    sum(len(ss.spans) for rs in part.resource_spans for ss in rs.scope_spans),
                )
                for b, part in self.split_traces(body).items()
            }
        elif path == "/v1/metrics":
            parts = {
                b: (part.SerializeToString(), 0) for b, part in self.split_metrics(body).items()
            }
        else:
            return 404
        worst = 200
        for b, (part_body, spans) in sorted(parts.items()):
            status = self._post(b, path, part_body)
            if status == 200:
                with self._lock:
                    self.posts[b] += 1
                    self.spans_sent[b] += spans
            elif worst == 200:
                worst = status
        return worst

    def _post(self, b: int, path: str, body: bytes) -> int:
        url = urlsplit(self.backends[b])
        deadline = time.monotonic() + RETRY_FOR_S
        while True:
            conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
            try:
                conn.request("POST", url.path.rstrip("/") + path, body=body, headers=PB)
                response = conn.getresponse()
                response.read()
                status, retry_after = response.status, response.getheader("Retry-After")
            finally:
                conn.close()
            if status not in (429, 503) or time.monotonic() > deadline:
                return status
            time.sleep(min(float(retry_after or 1), 1.0))

    @contextmanager
    def serving(self) -> Iterator[str]:
        """Runs the router as an OTLP/HTTP endpoint on 127.0.0.1 (what an SDK exports to);
        gives its base URL."""
        router = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = router.route(self.path, body)
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()
            thread.join(5)


def _scope_copy(part: ExportTraceServiceRequest, rs: ResourceSpans, ss: ScopeSpans) -> ScopeSpans:
    """Gives a new, empty copy of scope `ss` in `part`, under `part`'s copy of `rs`'s resource
    (one per resource: several scopes of one resource stay under it)."""
    for out_rs in part.resource_spans:
        if out_rs.resource == rs.resource and out_rs.schema_url == rs.schema_url:
            break
    else:
        out_rs = part.resource_spans.add()
        out_rs.resource.CopyFrom(rs.resource)
        out_rs.schema_url = rs.schema_url
    out_ss = out_rs.scope_spans.add()
    out_ss.scope.CopyFrom(ss.scope)
    out_ss.schema_url = ss.schema_url
    return out_ss
