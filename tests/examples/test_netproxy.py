from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from tokentrace.examples.netproxy import start_proxy

pytestmark = pytest.mark.slow


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join(5)


def _round_trip(port: int, payload: bytes) -> tuple[float, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        started = time.perf_counter()
        conn.sendall(payload)
        received = b""
        while len(received) < len(payload):
            received += conn.recv(65536)
        return time.perf_counter() - started, received


def test_proxy_adds_the_configured_delay(echo_port: int) -> None:
    with start_proxy(0, echo_port, delay_ms=60) as proxy:
        elapsed, echoed = _round_trip(proxy.port, b"ping")
    assert echoed == b"ping"
    assert elapsed >= 0.120  # 60 ms each way (a lower bound: no wall time is asserted beyond it)


def test_proxy_keeps_order_across_chunks(echo_port: int) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB in many chunks
    with start_proxy(0, echo_port, delay_ms=30, downstream_delay_ms=10) as proxy:
        elapsed, echoed = _round_trip(proxy.port, payload)
    assert echoed == payload  # every byte, in order
    assert elapsed >= 0.040  # both directions' delays paid (lower bound only: wall times vary)


def test_stop_is_idempotent_and_refuses_new_connections(echo_port: int) -> None:
    proxy = start_proxy(0, echo_port, delay_ms=0)
    port = proxy.port
    proxy.stop()
    proxy.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
