"""Fixtures of the collector tests: a fake clock, a real pipeline on a real DuckDB
file, and a live in-process collector (OTLP/HTTP + OTLP/gRPC on free ports)."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the trace builders beside this file

from tokentrace.collector.grpc_receiver import start_grpc_server  # noqa: E402
from tokentrace.collector.http_receiver import create_http_app  # noqa: E402
from tokentrace.collector.pipeline import Pipeline  # noqa: E402
from tokentrace.collector.sampling import Sampler  # noqa: E402
from tokentrace.collector.service import Collector  # noqa: E402
from tokentrace.collector.settings import CollectorSettings  # noqa: E402
from tokentrace.collector.writer import Writer  # noqa: E402
from tokentrace.store.connection import open_db  # noqa: E402


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeClock:
    """A monotonic ns clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_000_000_000_000

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1e9)


@dataclass
class PipelineRig:
    pipeline: Pipeline
    writer: Writer
    clock: FakeClock
    conn: Any

    def rows(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        self.writer.flush()
        return self.conn.execute(sql, params or []).fetchall()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_rig(tmp_path: Path, clock: FakeClock) -> Iterator[Any]:
    made: list[PipelineRig] = []

    def make(sampler: Sampler | None = None, max_pending: int = 256, **kw: Any) -> PipelineRig:
        conn = open_db(tmp_path / f"rig{len(made)}.duckdb")
        writer = Writer(conn, max_pending=max_pending)
        kw.setdefault("grace_s", 1.0)
        kw.setdefault("decision_wait_s", 30.0)
        pipeline = Pipeline(writer, sampler or Sampler(baseline=0.0), clock=clock, **kw)
        rig = PipelineRig(pipeline, writer, clock, conn)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.writer.close()
        rig.conn.close()


@dataclass
class LiveCollector:
    collector: Collector
    http_port: int
    grpc_port: int

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


def start_live(tmp_path: Path, **overrides: Any) -> tuple[LiveCollector, Any]:
    import uvicorn

    settings = CollectorSettings(
        db=tmp_path / "live.duckdb", http_port=free_port(), grpc_port=0, web_port=0,
        **{"grace_s": 0.2, "baseline": 0.0, **overrides},
    )  # fmt: skip
    collector = Collector(settings)
    collector.start()
    grpc_server, grpc_port = start_grpc_server(
        collector.pipeline, "127.0.0.1", 0, settings.max_body_bytes, collector.metrics
    )
    app = create_http_app(collector.pipeline, settings.max_body_bytes, collector.metrics)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=settings.http_port, log_level="warning",
                       lifespan="off")
    )  # fmt: skip
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    live = LiveCollector(collector, settings.http_port, grpc_port)

    def stop() -> None:
        grpc_server.stop(grace=None).wait(5)
        server.should_exit = True
        thread.join(10)
        collector.close()

    return live, stop


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveCollector]:
    collector, stop = start_live(tmp_path)
    try:
        yield collector
    finally:
        stop()
