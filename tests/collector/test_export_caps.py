"""Caps against a hostile (or buggy) OTLP sender: what one export can make the collector
hold or do is bounded (the security review's resource-exhaustion findings).

- a packed engine-step list is read up to a cap per span and per trace, without
  unpacking the rest, and one decision round hands the writer bounded batches;
- the tail buffer is bounded in bytes too (`max_buffered_bytes`), not only in spans;
- finding a trace's root does not scan its spans once per SERVER span.

Work is counted (list elements built, spans scanned), never timed.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import tracemalloc
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from otlp_traces import T0, new_id, request_trace

from tokentrace.analyzer import engine_steps as es
from tokentrace.analyzer.spans import KIND_INTERNAL, KIND_SERVER, Span
from tokentrace.collector.packed import PackedTrace
from tokentrace.collector.refusals import REFUSED_BUFFER_FULL
from tokentrace.collector.settings import ENV, CollectorSettings, resolve
from tokentrace.collector.trace_buffer import PendingTrace
from tokentrace.collector.writer import WriteBatch, Writer
from tokentrace.instrumentation import semconv as sc

MiB = 1024 * 1024
SDK_STEPS_PER_SPAN = 512  # instrumentation/_steps.py MAX_STEPS_PER_SPAN
#: what the caps must stay above, and at most: a few thousand a span (well above the
#: SDK's 512), and one trace's or one write batch's steps far below the millions an
#: 8 KB gzip export can carry
SPAN_CAP_RANGE = (4 * SDK_STEPS_PER_SPAN, 16_384)
BIG_CAP = 262_144


def _steps_span(starts: Any, trace_id: str | None = None, **lists: Any) -> Span:
    attrs = {sc.STEP_START_NS: starts, **lists}
    return Span(
        trace_id or new_id(16), new_id(8), "", sc.SPAN_ENGINE_STEPS, KIND_INTERNAL, T0, T0 + 1000,
        attrs, {sc.SERVICE_NAME: "engine"},
    )  # fmt: skip


def _packed_ones(n: int) -> str:
    return "[" + ",".join([str(T0)] * n) + "]"


# ---- 1. packed engine-step lists --------------------------------------------------------


def test_a_packed_step_list_of_a_million_is_read_up_to_the_cap_without_unpacking_the_rest(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # 2,000,000 steps packed: ~2 MB of "1," gzip to a few KB; unpacked whole they were
    # 2,000,000 EngineSteps (the review: 8 KB gzip -> 1.3 GB of RSS, 4,000,000 rows)
    n = 2_000_000
    packed = "[" + ",".join(["1"] * n) + "]"
    span = _steps_span(packed, **{sc.STEP_DURATION_US: packed, sc.STEP_REQUEST_IDS: packed})
    before = es.dropped_steps() if hasattr(es, "dropped_steps") else 0
    caplog.set_level(logging.WARNING)
    tracemalloc.start()
    try:
        steps = es.extract_engine_steps([span])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert SPAN_CAP_RANGE[0] <= len(steps) <= SPAN_CAP_RANGE[1], len(steps)
    # the lists were not unpacked whole (2,000,000 elements: >= 16 MB of list alone)
    assert peak < 8 * MiB, peak
    assert es.dropped_steps() - before == n - len(steps)
    said = [r.getMessage() for r in caplog.records if "engine-step batch span" in r.getMessage()]
    assert len(said) <= 1 and all(f"carries {n} steps" in m for m in said), said
    # the steps read are whole: every field of each came from its own list
    assert {(s.start_ns, s.duration_us) for s in steps} == {(1, 1)}


@pytest.mark.slow
def test_the_steps_of_one_trace_are_capped_however_many_batch_spans_it_holds() -> None:
    trace_id = new_id(16)
    per_span = 4096
    spans = [_steps_span(_packed_ones(per_span), trace_id) for _ in range(100)]  # 409,600 steps
    steps = es.extract_engine_steps(spans)
    assert 0 < len(steps) <= BIG_CAP // 2, len(steps)


def test_the_sdks_batches_are_read_whole_long_request_id_lists_included() -> None:
    """Below the caps nothing changes: a full SDK batch, whose request-id list (batches
    of 64 requests with long ids) is long enough to be read element by element."""
    n = SDK_STEPS_PER_SPAN
    ids = [",".join(f"req-{step:04d}-{k:02d}-" + "x" * 40 for k in range(64)) for step in range(n)]
    lists = {
        sc.STEP_DURATION_US: sc.pack_list([1000 + i for i in range(n)]),
        sc.STEP_PREFILL_TOKENS: sc.pack_list([i % 7 for i in range(n)]),
        sc.STEP_KV_USAGE: sc.pack_list([0.5] * n),
        sc.STEP_REQUEST_IDS: sc.pack_list(ids),
    }
    assert len(lists[sc.STEP_REQUEST_IDS]) > 1 * MiB  # far beyond what is parsed whole
    span = _steps_span(sc.pack_list([T0 + i for i in range(n)]), **lists)
    steps = es.extract_engine_steps([span])
    assert [s.start_ns for s in steps] == [T0 + i for i in range(n)]
    assert [s.duration_us for s in steps] == [1000 + i for i in range(n)]
    assert [s.prefill_tokens for s in steps] == [i % 7 for i in range(n)]
    assert [",".join(s.request_ids) for s in steps] == ids
    assert all(s.kv_usage == 0.5 for s in steps)


@pytest.mark.parametrize(
    "packed",
    [
        '[1, 2, "x"',  # cut short by an attribute length limit
        "[1 2 3]" + " " * 200_000,
        "{}" + " " * 200_000,
        "[" * 200_000,  # nested beyond the parser's recursion
        "[" * 5_000,  # the same, short
    ],
    ids=["cut-short", "no-comma", "no-list", "nested-long", "nested-short"],
)
def test_an_unreadable_long_packed_list_loses_the_span_not_the_trace(packed: str) -> None:
    good = _steps_span(_packed_ones(3))
    bad = _steps_span(packed, good.trace_id)
    assert len(es.extract_engine_steps([bad, good])) == 3


@pytest.mark.slow
def test_one_decision_round_hands_the_writer_bounded_batches_of_steps(
    make_rig: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = make_rig()
    submitted: list[int] = []
    real = Writer.submit_wait

    def submit_wait(self: Writer, batch: WriteBatch, timeout: float | None = None) -> bool:
        submitted.append(len(batch.engine_steps))
        return real(self, batch, timeout=timeout)

    monkeypatch.setattr(Writer, "submit_wait", submit_wait)
    per_span, traces = 4096, 40  # 163,840 steps decided in one round
    for _ in range(traces):
        assert rig.pipeline.offer([_steps_span(_packed_ones(per_span))]) is None
    assert rig.pipeline.decide_ready(force=True) == traces
    assert sum(submitted) == per_span * traces
    assert max(submitted) <= BIG_CAP // 2, submitted
    assert rig.rows("SELECT count(*) FROM engine_steps") == [(per_span * traces,)]


# ---- 2. finding the root ----------------------------------------------------------------


def test_finding_the_root_of_a_chain_of_server_spans_scans_its_spans_once_a_round(
    make_rig: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain of n SERVER spans sent deepest first: each is a root candidate whose
    parent is in the trace; checking each by scanning the trace's spans was n^2 with the
    pipeline's lock held (the receivers wait on it)."""
    n = 2000
    trace_id = new_id(16)
    ids = [new_id(8) for _ in range(n)]
    chain = [
        Span(
            trace_id,
            ids[i],
            ids[i - 1] if i else "",
            "hop",
            KIND_SERVER,
            T0,
            T0 + 1000,
            {},
            {sc.SERVICE_NAME: "gw"},
        )  # fmt: skip
        for i in range(n)
    ]
    scanned = 0
    real = PendingTrace.all_spans

    def all_spans(self: Any) -> list[Span]:
        nonlocal scanned
        spans = real(self)
        scanned += len(spans)
        return spans

    monkeypatch.setattr(PendingTrace, "all_spans", all_spans)
    rig = make_rig()
    assert rig.pipeline.offer(chain[::-1]) is None
    rig.clock.advance(5)
    assert rig.pipeline.decide_ready() == 1
    assert scanned <= 5 * n, scanned


# ---- 3. the tail buffer's bytes ---------------------------------------------------------


def _rootless(value: str, *, service: str = "svc") -> list[Span]:
    """One span whose parent never comes (held until decision_wait), with a big
    attribute: the same str object each time, so the test itself holds it once."""
    return [
        Span(
            new_id(16),
            new_id(8),
            new_id(8),
            "x",
            KIND_INTERNAL,
            T0,
            T0 + 1000,
            {"k": value},
            {sc.SERVICE_NAME: service},
        )  # fmt: skip
    ]


def test_big_attributes_fill_the_buffer_by_bytes_long_before_its_span_bound(
    make_rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The review: 40 one-span exports with a 15 MiB attribute each were all taken
    (660 MB of RSS); with the span bound alone 200,000 would be.  The default byte
    bound refuses them long before (a 1 GiB bound at most), as a full buffer is
    refused: 503 / UNAVAILABLE, and the log says which bound."""
    caplog.set_level(logging.WARNING, logger="tokentrace.collector")
    rig = make_rig(grace_s=1.0, decision_wait_s=30.0)  # the defaults otherwise
    p = rig.pipeline
    big = "A" * (15 * MiB)
    taken = 0
    for _ in range(200):
        why = p.offer(_rootless(big))
        if why is not None:
            break
        taken += 1
    assert why == REFUSED_BUFFER_FULL
    assert 1 <= taken <= 1024 // 15 + 1, taken
    assert p.buffered_spans == taken  # the span bound (200,000) was nowhere near
    began = [r.getMessage() for r in caplog.records if "refusing exports" in r.getMessage()]
    assert len(began) == 1 and "max_buffered_bytes" in began[0], began
    # released on decision: room again
    rig.clock.advance(31)
    assert p.decide_ready() == taken
    assert p.buffered_bytes == 0
    assert p.offer(_rootless(big)) is None


def test_the_byte_bound_refuses_what_would_pass_it_and_an_empty_buffer_takes_anything(
    make_rig: Any,
) -> None:
    rig = make_rig(max_buffered_bytes=10 * MiB)
    p = rig.pipeline
    assert p.offer(_rootless("B" * (20 * MiB))) is None  # an empty buffer takes any export
    assert p.buffered_bytes >= 20 * MiB
    assert p.offer(request_trace()) == REFUSED_BUFFER_FULL  # over the bound: nothing more
    assert p.readiness() is not None and "MiB" in p.readiness()  # type: ignore[operator]
    rig.clock.advance(31)
    p.decide_ready()
    assert p.buffered_bytes == 0 and p.readiness() is None
    assert p.offer(_rootless("C" * (4 * MiB))) is None
    assert p.offer(_rootless("C" * (4 * MiB))) is None
    assert p.offer(_rootless("C" * (4 * MiB))) == REFUSED_BUFFER_FULL  # 12 MiB > 10 MiB
    assert p.offer(request_trace()) is None  # a normal export still fits


def test_what_a_span_is_reckoned_to_weigh_counts_every_place_a_big_value_can_hide(
    make_rig: Any,
) -> None:
    from tokentrace.analyzer.spans import SpanEvent, SpanLink

    big = "D" * MiB
    plain = _rootless("")[0]
    places = {
        "name": {"name": big},
        "status message": {"status_message": big},
        "list attribute": {"attributes": {"k": [big]}},
        "bytes attribute": {"attributes": {"k": big.encode()}},
        "event": {"events": [SpanEvent("e", T0, {"k": big})]},
        "link": {"links": [SpanLink(new_id(16), new_id(8), {"k": big})]},
        "resource": {"resource": {sc.SERVICE_NAME: "svc", "k": big}},
        "scope": {"scope": big},
    }
    for where, change in places.items():
        rig = make_rig(max_buffered_bytes=MiB // 2)
        span = Span(**{**{f.name: getattr(plain, f.name) for f in fields(Span)}, **change})
        assert rig.pipeline.offer([span]) is None
        assert rig.pipeline.buffered_bytes >= MiB, where
    # a wide (non-ASCII) string counts what Python holds of it
    rig = make_rig(max_buffered_bytes=MiB // 2)
    assert rig.pipeline.offer(_rootless("\U0001f600" * (MiB // 4))) is None
    assert rig.pipeline.buffered_bytes >= MiB
    # a span of a benchmark request weighs about what the docs say (~1.2 KB)
    rig = make_rig()
    assert rig.pipeline.offer(request_trace()) is None
    assert 500 * 6 <= rig.pipeline.buffered_bytes <= 3000 * 6


def test_the_bytes_of_a_decode_workers_traces_are_bounded_too(make_rig: Any) -> None:
    rig = make_rig(max_buffered_bytes=10 * MiB)
    p = rig.pipeline

    def packed(value: str) -> PackedTrace:
        (span,) = _rootless(value)
        row = tuple(getattr(span, f.name) for f in fields(Span))
        return PackedTrace(span.trace_id, 1, [], False, pickle.dumps([row]), None)

    assert p.offer([packed("E" * (6 * MiB))]) is None
    assert p.buffered_bytes >= 6 * MiB
    assert p.offer([packed("E" * (6 * MiB))]) == REFUSED_BUFFER_FULL
    rig.clock.advance(31)
    assert p.decide_ready() == 1
    assert p.buffered_bytes == 0


def test_past_the_bytes_high_water_mark_the_oldest_traces_are_decided_early(make_rig: Any) -> None:
    rig = make_rig(max_buffered_bytes=100 * MiB)
    p = rig.pipeline
    chunk = "F" * (7 * MiB)
    while p.offer(_rootless(chunk)) is None:
        pass
    assert p.buffered_bytes > 90 * MiB
    p.decide_ready()  # nothing is due: none ended, none waited decision_wait
    assert p.stats.traces_evicted_early >= 1
    assert p.buffered_bytes <= 75 * MiB


def test_max_buffered_bytes_is_a_setting_flag_and_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert 256 * MiB <= CollectorSettings().max_buffered_bytes <= 1024 * MiB
    assert ENV["max_buffered_bytes"] == "TOKENTRACE_MAX_BUFFERED_BYTES"
    monkeypatch.setenv("TOKENTRACE_MAX_BUFFERED_BYTES", str(64 * MiB))
    assert resolve().max_buffered_bytes == 64 * MiB
    assert resolve({"max_buffered_bytes": 32 * MiB}).max_buffered_bytes == 32 * MiB
    monkeypatch.setenv("TOKENTRACE_MAX_BUFFERED_BYTES", "0")
    with pytest.raises(
        ValueError, match="max_buffered_bytes must be positive.*TOKENTRACE_MAX_BUFFERED_BYTES"
    ):
        resolve()
    out = subprocess.run(
        [sys.executable, "-m", "tokentrace.cli", "serve", "--help"],
        capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "200"},
    ).stdout  # fmt: skip
    assert "--max-buffered-bytes" in out and "TOKENTRACE_MAX_BUFFERED_BYTES" in out


def test_every_setting_is_in_the_settings_table_of_the_docs() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "collector.md").read_text()
    for name, f in CollectorSettings.__dataclass_fields__.items():
        switch = isinstance(f.default, bool)  # on by default: the flag turns it off
        assert ("--no-" if switch else "--") + name.replace("_", "-") in doc, name


def test_serve_hands_max_buffered_bytes_to_its_pipeline(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tokentrace.collector.collector import Collector

    collector = Collector(resolve({"db": tmp_path / "b.duckdb", "max_buffered_bytes": 3 * MiB}))
    try:
        assert collector.pipeline._buffer.max_bytes == 3 * MiB
    finally:
        collector.close()
