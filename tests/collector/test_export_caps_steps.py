"""What one export makes the collector build of engine steps is bounded, whatever number
of traces it holds: the per-span (4,096) and per-trace (65,536) caps alone let an export
of n traces build n x 65,536 steps.  Past the export's bound the batch spans lose their
step lists unread (counted, logged once); what fits, before and after them, is kept.

Work is counted (steps built, rows stored), never timed."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import httpx
import pytest
from collector_testkit import start_live
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from otlp_traces import T0, new_id, request_trace, to_protobuf

from tokentrace.analyzer.engine_steps import extract_engine_steps
from tokentrace.analyzer.spans import KIND_INTERNAL, Span
from tokentrace.collector import decode_pool
from tokentrace.instrumentation import semconv as sc

PB = {"Content-Type": "application/x-protobuf"}
#: the biggest export the tokentrace SDK sends: 512 batch spans of 512 steps each
SDK_SPAN_STEPS = 512
SDK_EXPORT_STEPS = 512 * SDK_SPAN_STEPS
#: what one export may make the collector build, at most (the bound stays above an SDK
#: export, and within twice it)
EXPORT_BOUND = 2 * SDK_EXPORT_STEPS


def _steps_span(steps: int, trace_id: str | None = None, service: str = "engine") -> Span:
    starts = "[" + ",".join(["1"] * steps) + "]"  # packed, as the SDK sends them
    return Span(
        trace_id or new_id(16), new_id(8), "", sc.SPAN_ENGINE_STEPS, KIND_INTERNAL, T0, T0 + 1000,
        {sc.STEP_START_NS: starts, sc.STEP_DURATION_US: starts, sc.STEP_COUNT: steps},
        {sc.SERVICE_NAME: service},
    )  # fmt: skip


def _hostile_export() -> tuple[ExportTraceServiceRequest, int]:
    """An SDK batch, a request, 10 traces of 16 spans of 4,096 steps (655,360: each trace
    at the per-trace cap), then a request and an SDK batch again, each group under its
    own resource.  Gives the export and how many steps fit the bound: the first batch,
    7 traces and 15 spans of the 8th (its 16th no longer fits, nor any span of the last
    two), and the last batch."""
    hostile: list[Span] = []
    for _ in range(10):
        trace_id = new_id(16)
        hostile += [_steps_span(4096, trace_id, service="hostile") for _ in range(16)]
    export = ExportTraceServiceRequest()
    for group in (
        [_steps_span(SDK_SPAN_STEPS, service="sdk-first")],
        request_trace(model="before"),
        hostile,
        request_trace(model="after"),
        [_steps_span(SDK_SPAN_STEPS, service="sdk-last")],
    ):
        export.resource_spans.extend(to_protobuf(group).resource_spans)
    fits = SDK_SPAN_STEPS + 7 * 65_536 + 15 * 4096 + SDK_SPAN_STEPS
    return export, fits


@pytest.mark.slow  # ~10 s each: the half million steps that fit are built and stored
@pytest.mark.parametrize("path", ["decode-worker", "in-process"])
def test_one_export_of_many_step_traces_builds_at_most_the_export_bound(
    tmp_path: Path, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Through a real collector: OTLP/HTTP protobuf decoded by a worker process, and
    OTLP/gRPC decoded in-process (its steps built at decision time)."""
    caplog.set_level(logging.WARNING, logger="tokentrace.collector")
    body, fits = _hostile_export()
    assert 10 * 16 * 4096 + 2 * SDK_SPAN_STEPS > EXPORT_BOUND >= fits
    before = getattr(decode_pool, "export_dropped_steps", lambda: 0)()
    live, stop = start_live(tmp_path, offload=path == "decode-worker")
    try:
        if path == "decode-worker":
            r = httpx.post(f"{live.http}/v1/traces", content=body.SerializeToString(), headers=PB,
                           timeout=60)  # fmt: skip
            assert r.status_code == 200, r.text
            assert live.decoder is not None and live.decoder.offloaded == 1
        else:
            with grpc.insecure_channel(live.grpc_target) as channel:
                trace_service_pb2_grpc.TraceServiceStub(channel).Export(body, timeout=60)
        stored = dict(live.rows("SELECT service, count(*) FROM engine_steps GROUP BY service"))
        # the bound holds, and everything that fits it is kept, after the hostile spans too
        assert sum(stored.values()) <= EXPORT_BOUND
        assert stored == {
            "sdk-first": SDK_SPAN_STEPS,
            "hostile": fits - 2 * SDK_SPAN_STEPS,
            "sdk-last": SDK_SPAN_STEPS,
        }
        # the requests of the export are summarized as ever
        assert sorted(live.rows("SELECT model FROM requests")) == [("after",), ("before",)]
    finally:
        stop()
    # the steps past the bound are counted (in the receiving process) and logged once
    dropped = 4096 + 2 * 16 * 4096  # the 8th trace's 16th span, and traces 9 and 10
    assert decode_pool.export_dropped_steps() - before == dropped
    said = [r.getMessage() for r in caplog.records if "read from one export" in r.getMessage()]
    assert len(said) <= 1 and all("'hostile'" in m for m in said), said


def test_the_biggest_sdk_export_is_read_whole() -> None:
    spans = [_steps_span(SDK_SPAN_STEPS) for _ in range(512)]  # each batch span its own trace
    attributes = [s.attributes for s in spans]
    assert decode_pool.limit_export_steps(spans) == (0, "")
    assert [s.attributes for s in spans] == attributes
    assert SDK_EXPORT_STEPS < decode_pool.MAX_STEPS_PER_EXPORT <= EXPORT_BOUND


def test_spans_past_the_bound_lose_their_step_lists_unread_and_keep_the_rest() -> None:
    a, b, c = _steps_span(3000), _steps_span(3000), _steps_span(900)
    b.attributes[sc.STEP_START_NS] = [1] * 3000  # an OTLP array counts the same
    assert decode_pool.limit_export_steps([a, b, c], budget=4000) == (3000, "engine")
    assert sc.STEP_START_NS in a.attributes and sc.STEP_START_NS in c.attributes
    assert b.attributes == {sc.STEP_COUNT: 3000}
    # what the per-span cap leaves unread is not charged to the export
    big = _steps_span(100_000)
    assert decode_pool.limit_export_steps([big], budget=4096) == (0, "")


def test_a_packed_list_is_never_counted_short() -> None:
    """The count (commas + 1) is at least what the analyzer reads: the bound holds for
    odd lists too (spaces, nesting, strings, bytes, empty)."""
    for starts in ("[ 1 , 2 ,3 ]", "[[1,2],[3]]", '["1,2", 3]', b"[1,2,3]", "[]", " [ ] ", "[5]"):
        span = _steps_span(1)
        span.attributes[sc.STEP_START_NS] = starts
        assert decode_pool._elements(starts) >= len(extract_engine_steps([span])), starts
