"""Engine steps: a count the engine does not give is None (NULL in the store), never 0,
and the queries that aggregate steps skip it (docs/conventions.md, "Unknown is not zero")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tokentrace.analyzer.diagnosis._base import Context
from tokentrace.analyzer.engine_steps import EngineStep, extract_engine_steps
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.collector.writer import WriteBatch, Writer
from tokentrace.instrumentation import semconv as sc
from tokentrace.store.connection import open_db, open_read_only

from . import spanfactory as f

TGI = {"service.name": "text-generation-inference.router"}


def _tgi_step(kind: str, start_ms: float, size: int | None, *, batch_size: int | None) -> list[Span]:
    """One TGI v3 step as its router emits it (backends/v3/src/queue.rs, backend.rs,
    client/sharded_client.rs): a root `batch` (`batch_size`, recorded where known), the
    backend's `prefill` / `decode` (no fields), the sharded client's (`size`) and one
    shard client's (`size`)."""
    tid = f.new_id(32)
    attrs = {} if batch_size is None else {"batch_size": batch_size}
    batch = f.span(tid, "batch", start_ms, 10, attrs=attrs, resource=TGI)
    backend = f.span(tid, kind, start_ms, 9, batch)
    sized = {} if size is None else {"size": size}
    sharded = f.span(tid, kind, start_ms + 1, 7, backend, attrs={"id": 3, **sized})
    shard = f.span(tid, kind, start_ms + 1, 6, sharded, attrs={"id": 3, **sized})
    sent = f.span(tid, "filter_send_generations", start_ms + 8, 0.5, backend)
    return [batch, backend, sharded, shard, sent]


def test_tgi_steps_as_its_router_nests_them() -> None:
    steps = extract_engine_steps(_tgi_step("decode", 0, 5, batch_size=5))
    (step,) = steps  # the backend's span is the step; the client spans below are its parts
    assert (step.batch_size, step.decode_seqs, step.prefill_tokens, step.queue_depth) == (5, 5, 0, None)
    assert step.duration_us == 9000
    (prefill,) = extract_engine_steps(_tgi_step("prefill", 0, 3, batch_size=3))
    # TGI counts no prefill tokens, and a chunking model's prefill step decodes the
    # running batch too, by how many is not said
    assert (prefill.batch_size, prefill.prefill_tokens, prefill.decode_seqs) == (3, None, None)


def test_tgi_step_size_from_the_batch_where_the_client_spans_are_not_sent() -> None:
    spans = _tgi_step("decode", 0, None, batch_size=4)
    (step,) = extract_engine_steps(spans)
    assert step.batch_size == 4


def test_tgi_step_with_no_size_anywhere_is_unknown() -> None:
    (step,) = extract_engine_steps(_tgi_step("decode", 0, None, batch_size=None))
    assert step.batch_size is None and step.decode_seqs is None


def test_sdk_steps_without_their_count_lists() -> None:
    t = 1_700_000_000_000_000_000
    span = Span(
        trace_id="ab" * 16, span_id="cd" * 8, parent_span_id="", name=sc.SPAN_ENGINE_STEPS,
        kind=1, start_ns=t, end_ns=t + 2000,
        attributes={sc.STEP_START_NS: sc.pack_list([t, t + 1000]),
                    sc.STEP_DURATION_US: sc.pack_list([1, 1]),
                    sc.STEP_BATCH_SIZE: sc.pack_list([4]),  # shorter than the steps
                    sc.STEP_QUEUE_DEPTH: sc.pack_list([-1, 2])},  # -1: the SDK's unknown
        resource={sc.SERVICE_NAME: "engine"},
    )  # fmt: skip
    first, second = extract_engine_steps([span])
    assert (first.prefill_tokens, first.decode_seqs, first.kv_usage) == (None, None, None)
    assert [first.batch_size, second.batch_size] == [4, None]
    assert [first.queue_depth, second.queue_depth] == [None, 2]


def _store(tmp_path: Path, steps: list[EngineStep], requests: list[RequestSummary]) -> Any:
    db = tmp_path / "steps.duckdb"
    writer = Writer(open_db(db))
    assert writer.submit_wait(WriteBatch(requests=requests, engine_steps=steps))
    writer.close()
    writer._conn.close()
    return open_read_only(db)


@pytest.mark.slow
def test_unknown_batch_sizes_are_stored_null_and_skipped(tmp_path: Path) -> None:
    # 9 of 10 TGI decode steps carry no size (issue 22's held-out traces: 9,084 of 9,584);
    # the one that does decodes 8 sequences. Read as 0, the median batch was 0
    steps = []
    for i in range(10):
        spans = _tgi_step("decode", i * 20, 8 if i == 0 else None, batch_size=8 if i == 0 else None)
        steps += extract_engine_steps(spans)
    t0 = steps[0].start_ns
    for step in steps:
        step.request_ids = ["live-1"]
    live = RequestSummary(trace_id="t" * 32, request_id="live-1", start_ns=t0, e2e_ms=300.0,
                          queue_ms=0.0, prefill_ms=10.0, decode_ms=290.0, server_ms=300.0,
                          source="tgi")  # fmt: skip
    conn = _store(tmp_path, steps, [live])
    try:
        stored = conn.execute(
            "SELECT count(*), count(batch_size), count(queue_depth) FROM engine_steps"
        ).fetchone()
        assert stored == (10, 1, 0)
        ctx = Context(conn, Filters())
        got = ctx.one("diag_batch_steps", [t0 - 10**9, t0 + 10**10])
        assert (got["steps"], got["batch_p50"], got["batch_max"]) == (1, 8, 8)
        depth = conn.execute("SELECT avg(queue_depth) FROM engine_steps").fetchone()
        assert depth == (None,)
    finally:
        conn.close()
