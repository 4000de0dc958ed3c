"""Fixtures of the collector tests: a fake clock, a real pipeline on a real DuckDB
file, and a live in-process collector (OTLP/HTTP + OTLP/gRPC on free ports)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from collector_testkit import LiveCollector, start_live  # noqa: E402

from tokentrace.collector.pipeline import Pipeline  # noqa: E402
from tokentrace.collector.sampling import P99Tracker, Sampler  # noqa: E402
from tokentrace.collector.writer import Writer  # noqa: E402
from tokentrace.store.connection import open_db  # noqa: E402


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
        # by default a trace waits for neither side of its request: only grace
        kw.setdefault("server_wait_s", 0.0)
        kw.setdefault("client_wait_s", 0.0)
        # by default only errors, SLOs, p99 outliers and rules keep a trace: no
        # baseline, and no warm-up (which keeps a model/route's first requests)
        sampler = sampler or Sampler(baseline=0.0, p99=P99Tracker(warmup=0))
        pipeline = Pipeline(writer, sampler, clock=clock, **kw)
        rig = PipelineRig(pipeline, writer, clock, conn)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.writer.close()
        rig.conn.close()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveCollector]:
    collector, stop = start_live(tmp_path)
    try:
        yield collector
    finally:
        stop()
