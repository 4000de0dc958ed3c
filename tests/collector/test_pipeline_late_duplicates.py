"""Spans that arrive after their trace was kept, and were already stored with it:
an OTLP exporter that timed out retries the export the collector had already
taken.  Each span of a kept trace is stored once; the summaries do not change."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from collector_testkit import LiveCollector, start_live
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from otlp_traces import new_id, request_trace, to_protobuf

from tokentrace.analyzer.spans import KIND_INTERNAL, Span
from tokentrace.collector.sampling import Sampler

PB = {"Content-Type": "application/x-protobuf"}


@pytest.fixture(params=["http", "http-decode-worker", "grpc"])
def sent(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[LiveCollector, str]]:
    live, stop = start_live(tmp_path, offload=request.param == "http-decode-worker")
    try:
        yield live, request.param
    finally:
        stop()


#: A decode worker starts (a new interpreter) inside the first export it decodes: over 4 s
#: on a loaded machine, near httpx's default 5 s timeout
SEND_TIMEOUT_S = 60


def _send(live: LiveCollector, how: str, spans: list[Span]) -> None:
    export = to_protobuf(spans)
    if how == "grpc":
        with grpc.insecure_channel(live.grpc_target) as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            reply = stub.Export(export, timeout=SEND_TIMEOUT_S)
        assert reply.partial_success.rejected_spans == 0
    else:
        r = httpx.post(f"{live.http}/v1/traces", content=export.SerializeToString(), headers=PB,
                       timeout=SEND_TIMEOUT_S)  # fmt: skip
        assert r.status_code == 200, r.text


def _late_child(of: list[Span]) -> Span:
    root = of[-1]
    return Span(
        root.trace_id, new_id(8), root.span_id, "tool.call", KIND_INTERNAL,
        root.start_ns, root.end_ns, {}, root.resource,
    )  # fmt: skip


def _stored(live: LiveCollector, trace_id: str) -> tuple[int, int, int, int]:
    """(span rows, distinct span ids, request rows, kept_traces rows) of the trace."""
    (spans,) = live.rows(
        "SELECT count(*), count(DISTINCT span_id) FROM spans WHERE trace_id = ?", [trace_id]
    )
    (requests,) = live.rows("SELECT count(*) FROM requests WHERE trace_id = ?", [trace_id])
    (kept,) = live.rows("SELECT count(*) FROM kept_traces WHERE trace_id = ?", [trace_id])
    return spans[0], spans[1], requests[0], kept[0]


@pytest.mark.slow
def test_an_export_retried_after_the_decision_is_stored_once(sent) -> None:  # type: ignore[no-untyped-def]
    live, how = sent
    kept = request_trace(error=True)
    _send(live, how, kept)
    live.settle()  # decided and written: the retry below is late
    assert live.collector.pipeline.is_decided(kept[0].trace_id) is True
    _send(live, how, kept)  # the exporter timed out waiting for the reply: it sends again
    assert _stored(live, kept[0].trace_id) == (6, 6, 1, 1)
    stats = live.collector.pipeline.stats
    assert (stats.late_spans_kept, stats.late_duplicates_dropped) == (0, 6)
    if how == "http-decode-worker":
        assert live.decoder is not None and live.decoder.offloaded == 2


@pytest.mark.slow
def test_a_late_span_sent_twice_is_stored_once(sent) -> None:  # type: ignore[no-untyped-def]
    live, how = sent
    kept = request_trace(error=True)
    _send(live, how, kept)
    live.settle()
    late = _late_child(kept)
    _send(live, how, [late])
    live.settle()  # the first copy is written before the second comes
    _send(live, how, [late])
    other = _late_child(kept)
    _send(live, how, [other, other])  # twice in one export, before any round writes it
    assert _stored(live, kept[0].trace_id) == (8, 8, 1, 1)
    stats = live.collector.pipeline.stats
    assert (stats.late_spans_kept, stats.late_duplicates_dropped) == (2, 2)
    metrics = httpx.get(f"{live.http}/metrics").text
    assert 'tokentrace_duplicate_spans_total{when="late"} 2.0' in metrics
    assert 'tokentrace_late_spans_total{kept="true"} 2.0' in metrics


def test_a_dropped_trace_sent_again_is_counted_dropped(live) -> None:  # type: ignore[no-untyped-def]
    dropped = request_trace()
    body = to_protobuf(dropped).SerializeToString()
    assert httpx.post(f"{live.http}/v1/traces", content=body, headers=PB).status_code == 200
    live.settle()
    assert httpx.post(f"{live.http}/v1/traces", content=body, headers=PB).status_code == 200
    assert live.rows("SELECT count(*) FROM requests") == [(1,)]
    assert live.rows("SELECT count(*) FROM spans") == [(0,)]
    stats = live.collector.pipeline.stats
    assert (stats.late_spans_dropped, stats.late_duplicates_dropped) == (6, 0)
    metrics = httpx.get(f"{live.http}/metrics").text
    assert 'tokentrace_late_spans_total{kept="false"} 6.0' in metrics


@pytest.mark.slow
def test_a_retry_inside_the_buffer_and_after_the_decision_agree(tmp_path: Path) -> None:
    # the same retried export, once while its trace is buffered and once after:
    # both store the trace's spans once.  A long grace keeps `before` buffered until
    # the test decides (settle): with the usual 0.2 s, a loaded machine's pause between
    # the two posts let the decider take it first, and its retry came late too
    live, stop = start_live(tmp_path, grace_s=600)
    try:
        before, after = request_trace(error=True), request_trace(error=True)
        for spans in (before, after):
            body = to_protobuf(spans).SerializeToString()
            assert httpx.post(f"{live.http}/v1/traces", content=body, headers=PB).status_code == 200
            if spans is after:
                live.settle()
            assert httpx.post(f"{live.http}/v1/traces", content=body, headers=PB).status_code == 200
        assert _stored(live, before[0].trace_id) == _stored(live, after[0].trace_id) == (6, 6, 1, 1)
        metrics = httpx.get(f"{live.http}/metrics").text
        assert 'tokentrace_duplicate_spans_total{when="buffered"} 6.0' in metrics
        assert 'tokentrace_duplicate_spans_total{when="late"} 6.0' in metrics
    finally:
        stop()


def test_kept_span_ids_are_held_only_with_cached_decisions(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(Sampler(baseline=0.0), decision_cache_size=3)
    traces = [request_trace(error=True) for _ in range(8)]
    for spans in traces:
        rig.pipeline.add(spans)
        rig.clock.advance(1.5)
        rig.pipeline.decide_ready()
    # the memory bound: span ids are remembered for kept traces still in the cache only
    assert len(rig.pipeline._cache.kept_span_ids) == 3
    newest = traces[-1]
    assert rig.pipeline.add(newest)  # a retry of a cached, kept trace
    rig.pipeline.decide_ready()
    assert rig.rows("SELECT count(*) FROM spans WHERE trace_id = ?", [newest[0].trace_id]) == [(6,)]
    assert rig.pipeline.stats.late_duplicates_dropped == 6


@pytest.mark.slow
@pytest.mark.parametrize("offload", [False, True], ids=["in-process", "decode-worker"])
def test_a_span_twice_in_one_export_is_stored_once(tmp_path: Path, offload: bool) -> None:
    live, stop = start_live(tmp_path, offload=offload)
    try:
        kept = request_trace(error=True)
        body = to_protobuf(kept + kept).SerializeToString()
        r = httpx.post(f"{live.http}/v1/traces", content=body, headers=PB, timeout=SEND_TIMEOUT_S)
        assert r.status_code == 200
        assert _stored(live, kept[0].trace_id) == (6, 6, 1, 1)
        assert live.collector.pipeline.stats.duplicate_spans_dropped == 6
    finally:
        stop()
