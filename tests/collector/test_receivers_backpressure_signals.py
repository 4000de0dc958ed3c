"""Backpressure as an SRE meets it: one line when the receivers start refusing
exports (naming the bound reached), one when they take them again (how many were
refused meanwhile), never a line per refusal; and over gRPC the refusal carries a
`google.rpc.RetryInfo` where OTLP clients look for it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from collector_testkit import LiveCollector
from google.rpc.error_details_pb2 import RetryInfo
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from otlp_traces import request_trace, to_protobuf

from tokentrace.collector.grpc_receiver import METRICS_SERVICE, RETRY_AFTER_S, TRACE_SERVICE
from tokentrace.collector.refusals import REFUSED_BUFFER_FULL, REFUSED_WRITER_BEHIND
from tokentrace.collector.writer import Writer
from tokentrace.instrumentation import semconv as sc


def _said(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    """The collector's lines containing `words`; each must be a WARNING, which
    `serve` shows without -v (the end as well as the start)."""
    lines = [r for r in caplog.records if r.name == "tokentrace.collector" and words in r.getMessage()]
    assert all(r.levelno == logging.WARNING for r in lines), [(r.levelname, r.getMessage()) for r in lines]
    return [r.getMessage() for r in lines]


def _begins(caplog: pytest.LogCaptureFixture) -> list[str]:
    return _said(caplog, "refusing exports")


def _ends(caplog: pytest.LogCaptureFixture) -> list[str]:
    return _said(caplog, "taking exports again")


# ---- the log ----------------------------------------------------------------------------


def test_a_full_buffer_is_logged_once_when_it_begins_and_once_when_it_ends(
    make_rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tokentrace.collector")
    rig = make_rig(max_buffered_spans=6)
    p = rig.pipeline
    assert p.offer(request_trace()) is None  # an empty buffer takes any export
    for _ in range(3):
        assert p.offer(request_trace()) == REFUSED_BUFFER_FULL
    (began,) = _begins(caplog)
    assert "max_buffered_spans 6" in began, began
    assert _ends(caplog) == []  # still refusing: nothing more

    p.decide_ready(force=True)  # room again
    assert p.offer(request_trace()) is None
    (ended,) = _ends(caplog)
    assert "3 exports were refused meanwhile (buffer_full 3)" in ended, ended
    p.decide_ready(force=True)
    assert p.offer(request_trace()) is None  # taken, as before: nothing to say
    assert len(_ends(caplog)) == 1 and len(_begins(caplog)) == 1


def test_a_full_writer_queue_names_max_pending_writes(
    make_rig: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="tokentrace.collector")
    rig = make_rig(max_pending=3)
    with monkeypatch.context() as m:
        m.setattr(Writer, "pending", property(lambda w: w.capacity))  # the writer is behind
        assert rig.pipeline.offer(request_trace()) == REFUSED_WRITER_BEHIND
        assert rig.pipeline.offer(request_trace()) == REFUSED_WRITER_BEHIND
    (began,) = _begins(caplog)
    assert "writer queue is full" in began and "max_pending_writes 3" in began, began
    assert rig.pipeline.offer(request_trace()) is None
    (ended,) = _ends(caplog)
    assert "2 exports were refused meanwhile (writer_behind 2)" in ended, ended


def test_import_waiting_for_room_logs_no_backpressure(
    make_rig: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """`tokentrace import` offers through `add()` and decides when refused: no receiver
    refused anything, so there is nothing to warn about."""
    caplog.set_level(logging.INFO, logger="tokentrace.collector")
    rig = make_rig(max_buffered_spans=6)
    assert rig.pipeline.add(request_trace())
    assert not rig.pipeline.add(request_trace())
    assert _begins(caplog) == []


# ---- gRPC: RetryInfo ---------------------------------------------------------------------


def _call(live: LiveCollector, service: str, body: bytes) -> grpc.RpcError | None:
    with grpc.insecure_channel(live.grpc_target) as channel:
        export: Callable[..., Any] = channel.unary_unary(f"/{service}/Export")
        try:
            export(body, timeout=10)
        except grpc.RpcError as exc:
            return exc
    return None


def _assert_retry_info(error: grpc.RpcError | None) -> None:
    assert error is not None, "the export was taken"
    assert error.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    trailers = dict(error.trailing_metadata())  # type: ignore[attr-defined]
    # the standard status details (what grpcio-status's rpc_status.from_call and the Go
    # OpenTelemetry Collector read): a google.rpc.Status matching the call's own
    status = Status.FromString(trailers["grpc-status-details-bin"])
    assert status.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert status.message == error.details()  # type: ignore[attr-defined]
    (detail,) = status.details
    retry = RetryInfo()
    assert detail.Unpack(retry), detail.type_url
    assert (retry.retry_delay.seconds, retry.retry_delay.nanos) == (RETRY_AFTER_S, 0)
    # the trailer the Python OTel exporter reads, and the plain one kept for humans
    assert RetryInfo.FromString(trailers["google.rpc.retryinfo-bin"]) == retry
    assert trailers["retry-after"] == str(RETRY_AFTER_S)


@pytest.fixture
def tiny_buffer(tmp_path: Any) -> Any:
    from collector_testkit import start_live

    # nothing is decided during the test (long grace): the buffer stays full
    live, stop = start_live(tmp_path, max_buffered_spans=6, grace_s=600)
    try:
        yield live
    finally:
        stop()


def test_grpc_backpressure_carries_retry_info(
    tiny_buffer: LiveCollector, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tokentrace.collector")
    body = to_protobuf(request_trace()).SerializeToString()
    assert _call(tiny_buffer, TRACE_SERVICE, body) is None
    for _ in range(3):
        _assert_retry_info(_call(tiny_buffer, TRACE_SERVICE, body))
    (began,) = _begins(caplog)  # three refusals, one line
    assert "max_buffered_spans 6" in began


def _gpu_export() -> bytes:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    kv = rm.resource.attributes.add()
    kv.key, kv.value.string_value = sc.SERVICE_NAME, "worker"
    metric = rm.scope_metrics.add().metrics.add()
    metric.name = sc.METRIC_GPU_UTIL
    dp = metric.gauge.data_points.add()
    dp.time_unix_nano, dp.as_double = 1_700_000_000_000_000_000, 50.0
    a = dp.attributes.add()
    a.key, a.value.int_value = sc.GPU_INDEX, 0
    return req.SerializeToString()


def test_grpc_metrics_refused_by_a_full_writer_carry_retry_info(
    live: LiveCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live.collector.writer, "submit", lambda batch: False)  # the queue is full
    _assert_retry_info(_call(live, METRICS_SERVICE, _gpu_export()))
