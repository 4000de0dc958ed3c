"""Big protobuf exports decoded in a worker process: the same spans and summaries as
in-process, the same rows stored, a dead worker loses nothing, and a killed
collector leaves no worker behind."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from otlp_traces import new_id, request_trace, to_protobuf
from tt_testkit import start_serve

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import KIND_SERVER, Span
from tokentrace.collector.decode_pool import OFFLOAD_MIN_BYTES, DecodePool
from tokentrace.collector.otlp import decode_protobuf_partial
from tokentrace.collector.packed import PackedTrace, span_count
from tokentrace.collector.sampling import P99Tracker, Sampler
from tokentrace.collector.writer import itl_histogram
from tokentrace.store.connection import open_db
from tokentrace.store.schema import ITL_BUCKET_BOUNDS_MS

PB = {"Content-Type": "application/x-protobuf"}


def _export_spans(traces: int = 40) -> list[Span]:
    spans: list[Span] = []
    for i in range(traces):
        spans += request_trace(tokens=30 + i, error=(i % 7 == 3), ttft_ms=20.0 + i)
    # a SERVER span under a parent that is not in the export: a root candidate
    # the worker must keep; and one under a parent that is: one it must drop
    trace_id = new_id(16)
    outside = request_trace(trace_id, parent_span_id=new_id(8))
    inside = request_trace(trace_id, parent_span_id=outside[-1].span_id)
    return spans + outside + inside


def _decode(pool: DecodePool, body: bytes) -> Any:
    return asyncio.run(pool.decode(body))


def _ready_pool(**kw: Any) -> DecodePool:
    """A pool whose worker has started (before, big exports are decoded in-process)."""
    pool = DecodePool(1, **kw)
    assert pool.wait_ready(120), "the decode worker did not start"
    return pool


def test_worker_gives_the_in_process_spans_and_summaries() -> None:
    spans = _export_spans()
    body = to_protobuf(spans).SerializeToString()
    pool = _ready_pool(min_bytes=0, itl_bounds_ms=ITL_BUCKET_BOUNDS_MS)
    try:
        packed, rejected = _decode(pool, body)
    finally:
        pool.close()
    assert pool.offloaded == 1 and not rejected
    assert all(isinstance(t, PackedTrace) for t in packed)
    local, _ = decode_protobuf_partial(body)
    assert span_count(packed) == len(local) == len(spans)
    by_trace: dict[str, list[Span]] = {}
    for s in local:
        by_trace.setdefault(s.trace_id, []).append(s)
    assert [t.trace_id for t in packed] == list(by_trace)
    for t in packed:
        group = by_trace[t.trace_id]
        assert t.spans() == group
        assert t.pre == summarize_trace(group)
        assert t.itl_counts == [itl_histogram(r.itl_gaps_ms) for r in t.pre.requests]
        assert t.error == any(s.status_code == 2 for s in group)
        ids = {s.span_id for s in group}
        assert t.roots == [
            s.parent_span_id
            for s in group
            if not s.parent_span_id or (s.kind == KIND_SERVER and s.parent_span_id not in ids)
        ]
    assert sum(t.error for t in packed) == 6  # the failed requests are flagged


def test_small_exports_stay_in_process_and_bad_bodies_fail_the_same_way() -> None:
    pool = DecodePool(1)  # default threshold
    try:
        spans, _ = _decode(pool, to_protobuf(request_trace()).SerializeToString())
        assert spans and isinstance(spans[0], Span) and pool.offloaded == 0
        big = to_protobuf(_export_spans()).SerializeToString()
        eager = _ready_pool(min_bytes=0)
        try:
            with pytest.raises(ValueError, match="invalid OTLP protobuf"):
                _decode(eager, big[: len(big) // 2] + b"\xff\xff")
        finally:
            eager.close()
    finally:
        pool.close()


def _rows(conn: Any, sql: str) -> list[tuple[Any, ...]]:
    return conn.execute(sql).fetchall()


@pytest.mark.slow
def test_packed_and_in_process_paths_store_the_same_rows(make_rig: Any, clock: Any) -> None:
    """Same exports through both paths, including spans of one trace split over
    two exports (the worker's summary then no longer covers the trace)."""
    spans = _export_spans()
    split = request_trace(tokens=50)
    first, second = [*spans, *split[:3]], split[3:]
    bodies = [to_protobuf(first).SerializeToString(), to_protobuf(second).SerializeToString()]
    pool = _ready_pool(min_bytes=0, itl_bounds_ms=ITL_BUCKET_BOUNDS_MS)
    try:
        packed = [_decode(pool, b)[0] for b in bodies]
        assert pool.offloaded == 2
    finally:
        pool.close()
    local = [decode_protobuf_partial(b)[0] for b in bodies]
    rigs = []
    for exports in (local, packed):
        rig = make_rig(Sampler(baseline=0.0, p99=P99Tracker(warmup=0)))
        for export in exports:
            assert rig.pipeline.offer(export) is None
        assert rig.pipeline.buffered_spans == len(spans) + len(split)
        clock.advance(5)
        rig.pipeline.decide_ready()
        rigs.append(rig)
    plain, via_pool = rigs
    for sql in (
        "SELECT * FROM requests ORDER BY trace_id, request_id",
        "SELECT * FROM itl_hist ORDER BY trace_id, request_id",
        "SELECT * EXCLUDE (decided_ns) FROM kept_traces ORDER BY trace_id",
        "SELECT * FROM spans ORDER BY trace_id, span_id",
    ):
        expected = plain.rows(sql)
        assert via_pool.rows(sql) == expected and expected, sql
    assert len(plain.rows("SELECT * FROM kept_traces")) == 6  # the errors, kept whole
    assert plain.pipeline.stats.traces_decided == via_pool.pipeline.stats.traces_decided


@pytest.mark.slow
def test_late_packed_spans_follow_the_decision(make_rig: Any, clock: Any) -> None:
    kept, dropped = request_trace(error=True), request_trace()
    pool = _ready_pool(min_bytes=0)
    try:
        early, _ = _decode(pool, to_protobuf(kept[1:] + dropped[1:]).SerializeToString())
        late, _ = _decode(pool, to_protobuf(kept[:1] + dropped[:1]).SerializeToString())
    finally:
        pool.close()
    rig = make_rig(Sampler(baseline=0.0, p99=P99Tracker(warmup=0)))
    assert rig.pipeline.offer(early) is None
    clock.advance(5)
    rig.pipeline.decide_ready()
    assert rig.pipeline.offer(late) is None
    rig.pipeline.decide_ready()
    stats = rig.pipeline.stats
    assert (stats.late_spans_kept, stats.late_spans_dropped) == (1, 1)
    stored = rig.rows("SELECT trace_id, count(*) FROM spans GROUP BY trace_id")
    assert stored == [(kept[0].trace_id, len(kept))]


@pytest.mark.slow
def test_a_dead_worker_loses_nothing() -> None:
    spans = _export_spans()
    body = to_protobuf(spans).SerializeToString()
    pool = _ready_pool(min_bytes=0)
    try:
        _decode(pool, body)
        (pid,) = pool.worker_pids()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60  # (a loaded machine's pool may notice it late)
        while time.monotonic() < deadline:  # the pool notices the death
            got, _ = _decode(pool, body)
            assert span_count(got) == len(spans)
            if pool.fallbacks:
                break
            time.sleep(0.05)
        assert pool.fallbacks == 1 and pool.worker_restarts == 1
        assert pool.wait_ready(120)  # the replacement was started at once
        again, _ = _decode(pool, body)  # the fresh pool takes over
        assert isinstance(again[0], PackedTrace) and span_count(again) == len(spans)
    finally:
        pool.close()


@pytest.mark.slow
def test_big_exports_never_wait_for_a_worker_to_start() -> None:
    """A worker takes 1-4 s to start (a new interpreter): an export that waited for
    it would outlast the SDK's 3 s timeout, and the SDK would count a batch that
    landed as dropped.  Until a worker is ready, big exports are decoded in-process."""
    spans = _export_spans()
    body = to_protobuf(spans).SerializeToString()
    pool = DecodePool(1, min_bytes=0)
    try:
        first, _ = _decode(pool, body)  # starts the worker, does not wait for it
        assert isinstance(first[0], Span) and len(first) == len(spans)
        assert (pool.decoded_while_starting, pool.offloaded) == (1, 0)
        assert pool.wait_ready(120)
        second, _ = _decode(pool, body)
        assert isinstance(second[0], PackedTrace) and span_count(second) == len(spans)
        assert (pool.decoded_while_starting, pool.offloaded) == (1, 1)
    finally:
        pool.close()
    third, _ = _decode(pool, body)  # closed: in-process, never restarted
    assert isinstance(third[0], Span) and not pool.worker_pids()


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for t in tasks.iterdir() for c in (t / "children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc")
def test_serve_stores_big_exports_and_its_worker_dies_with_it(tmp_path: Path) -> None:
    server = start_serve(tmp_path, "--grace-s", "0.05")
    try:
        deadline = time.monotonic() + 60
        while not [p for p in _children(server.proc.pid) if _alive(p)]:
            assert time.monotonic() < deadline, "serve should start its decode worker with itself"
            time.sleep(0.05)
        bodies = [to_protobuf(_export_spans(400)).SerializeToString() for _ in range(2)]
        assert min(map(len, bodies)) >= OFFLOAD_MIN_BYTES  # sized for the worker path
        for b in bodies:
            r = httpx.post(f"{server.otlp_http}/v1/traces", content=b, headers=PB, timeout=30)
            assert r.status_code == 200, r.text
        assert [p for p in _children(server.proc.pid) if _alive(p)]
    finally:
        server.stop()
    conn = open_db(server.db)
    try:
        assert conn.execute("SELECT count(*) FROM requests").fetchone() == (2 * 402,)
    finally:
        conn.close()

    server = start_serve(tmp_path, "--grace-s", "600", db=tmp_path / "k.duckdb")
    try:
        r = httpx.post(f"{server.otlp_http}/v1/traces", content=bodies[0], headers=PB, timeout=30)
        assert r.status_code == 200
        workers = [p for p in _children(server.proc.pid) if _alive(p)]
        assert workers
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
        deadline = time.monotonic() + 60  # (returns as soon as they are gone)
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = [p for p in workers if _alive(p)]
        for p in survivors:  # they hold the server's stdout: stop() would wait on them
            os.kill(p, signal.SIGKILL)
        assert not survivors, "decode workers outlived a kill -9"
    finally:
        server.stop()
