"""A real OTLP/HTTP trace receiver on 127.0.0.1 that answers only when its gate is open:
a collector slower than the spans that end, held as long as a test needs (no sleeps)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

#: the longest an export waits on a closed gate (a safety net: tests open it)
HOLD_AT_MOST_S = 60.0


class GatedTraceReceiver:
    """Keeps the spans of each export (their names), then waits for `gate` before answering 200."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.exports = 0
        self.span_names: list[str] = []
        self._lock = threading.Lock()
        self._received = threading.Condition(self._lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                names = [
                    span.name
                    for rs in ExportTraceServiceRequest.FromString(body).resource_spans
                    for ss in rs.scope_spans
                    for span in ss.spans
                ]
                with receiver._received:
                    receiver.exports += 1
                    receiver.span_names.extend(names)
                    receiver._received.notify_all()
                receiver.gate.wait(HOLD_AT_MOST_S)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def spans(self) -> int:
        with self._lock:
            return len(self.span_names)

    def wait_for_exports(self, count: int, timeout_s: float = 30.0) -> bool:
        """Waits until `count` exports have come in (held at the gate or answered)."""
        with self._received:
            return self._received.wait_for(lambda: self.exports >= count, timeout_s)

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()
