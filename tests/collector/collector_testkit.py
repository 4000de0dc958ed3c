"""Helpers of the collector tests: a live in-process collector (OTLP/HTTP + OTLP/gRPC on
free ports).  A uniquely named module: `conftest` names collide across test folders."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tt_testkit import ThreadServer, bound_socket, free_port

from tokentrace.collector.collector import Collector
from tokentrace.collector.decode_pool import DecodePool
from tokentrace.collector.grpc_receiver import start_grpc_server
from tokentrace.collector.http_receiver import create_http_app
from tokentrace.collector.settings import CollectorSettings
from tokentrace.store.schema import ITL_BUCKET_BOUNDS_MS

__all__ = ["LiveCollector", "free_port", "start_live"]


@dataclass
class LiveCollector:
    collector: Collector
    http_port: int
    grpc_port: int
    decoder: DecodePool | None = None

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def settle(self) -> None:
        """Decides everything buffered and waits until it is written."""
        self.collector.pipeline.decide_ready(force=True)
        self.collector.writer.flush()

    def rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        self.settle()
        cur = self.collector.conn.cursor()
        try:
            return cur.execute(sql, params or []).fetchall()
        finally:
            cur.close()


def start_live(
    tmp_path: Path, *, offload: bool = False, **overrides: Any
) -> tuple[LiveCollector, Any]:
    """Starts a collector; `offload`: every OTLP/HTTP protobuf export, however
    small, is decoded by a decode worker process (the path of big exports).

    The OTLP/HTTP socket is bound first and served on as it is: a port picked free and
    bound later was open to gRPC's own bind of port 0 in between.  A start that fails
    part-way stops what it started (else its threads, files and sockets outlive the test)."""
    sock = bound_socket()
    stops: list[Any] = [sock.close]

    def stop() -> None:
        for step in reversed(stops):
            step()

    try:
        settings = CollectorSettings(
            db=tmp_path / "live.duckdb", http_port=sock.getsockname()[1], grpc_port=0, web_port=0,
            **{"grace_s": 0.2, "baseline": 0.0, "p99_warmup": 0, **overrides},
        )  # fmt: skip
        collector = Collector(settings)
        stops.append(collector.close)
        collector.start()
        grpc_server, grpc_port = start_grpc_server(
            collector.pipeline, "127.0.0.1", 0, settings.max_body_bytes, collector.metrics
        )
        stops.append(lambda: grpc_server.stop(grace=None).wait(5))
        decoder = (
            DecodePool(1, min_bytes=0, itl_bounds_ms=ITL_BUCKET_BOUNDS_MS) if offload else None
        )
        if decoder is not None:
            stops.append(decoder.close)
        # until its worker is ready, the pool decodes in-process: wait, so every export is offloaded
        assert decoder is None or decoder.wait_ready(120), "the decode worker did not start"
        app = create_http_app(
            collector.pipeline, settings.max_body_bytes, collector.metrics, decoder
        )
        server = ThreadServer(app, sock=sock).__enter__()
        stops.append(server.__exit__)
    except BaseException:
        stop()
        raise
    return LiveCollector(collector, settings.http_port, grpc_port, decoder), stop
