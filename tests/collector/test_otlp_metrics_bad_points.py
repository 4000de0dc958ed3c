"""One bad data point of a GPU metrics export is refused alone, whatever the encoding.

OTLP/JSON used to refuse the whole export (400) for a bad `timeUnixNano` or a value of
the wrong type in one point, where protobuf refuses the point and stores the rest
(partial success).  And NaN or an infinity in a double column (utilization, SM clock,
power) was stored: one NaN utilization makes every mean over that GPU NaN.  Real
exports over OTLP/HTTP (protobuf and JSON) and OTLP/gRPC to a live collector.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from collector_testkit import start_live
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from test_otlp_metrics_gpu_columns import _export as gpu_export

from tokentrace.instrumentation import semconv as sc

TS = 1_700_000_000_000_000_000
PB = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}

#: (metric, gpu.index, value): stored
GOOD: list[tuple[str, int, float | int]] = [
    (sc.METRIC_GPU_UTIL, 0, 55.0),
    (sc.METRIC_GPU_SM_CLOCK, 0, 1410.0),
    (sc.METRIC_GPU_POWER, 0, 250.5),
    (sc.METRIC_GPU_MEM_USED, 0, 2**33),
]
#: values no double column may hold, each on its own GPU: refused in every encoding
NOT_FINITE: list[tuple[str, int, float | int]] = [
    (sc.METRIC_GPU_UTIL, 1, math.nan),
    (sc.METRIC_GPU_SM_CLOCK, 2, math.inf),
    (sc.METRIC_GPU_POWER, 3, -math.inf),
]
STORED = [(0, TS, 55.0, 1410.0, 250.5, 2**33)]


def _protobuf(points: list[tuple[str, int, float | int]]) -> ExportMetricsServiceRequest:
    return gpu_export([(name, gpu, value, TS) for name, gpu, value in points])


def _json_value(value: float | int) -> dict[str, Any]:
    if isinstance(value, int):
        return {"asInt": str(value)}
    if math.isnan(value):  # proto3 JSON spells the doubles JSON has no number for
        return {"asDouble": "NaN"}
    if math.isinf(value):
        return {"asDouble": "Infinity" if value > 0 else "-Infinity"}
    return {"asDouble": value}


def _json_point(name: str, gpu: int, fields: dict[str, Any]) -> dict[str, Any]:
    point = {
        "timeUnixNano": str(TS),
        "attributes": [{"key": sc.GPU_INDEX, "value": {"intValue": str(gpu)}}],
        **fields,
    }
    return {"name": name, "gauge": {"dataPoints": [point]}}


def _json(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    resource = {"attributes": [{"key": sc.SERVICE_NAME, "value": {"stringValue": "worker"}}]}
    return {"resourceMetrics": [{"resource": resource, "scopeMetrics": [{"metrics": metrics}]}]}


def _export(
    live: Any, protocol: str, points: list[tuple[str, int, float | int]]
) -> tuple[int, str]:
    """Sends `points` as one export; gives the refused data points and the message."""
    if protocol == "grpc":
        with grpc.insecure_channel(live.grpc_target) as channel:
            stub = metrics_service_pb2_grpc.MetricsServiceStub(channel)
            reply = stub.Export(_protobuf(points), timeout=10)
        return reply.partial_success.rejected_data_points, reply.partial_success.error_message
    if protocol == "http/protobuf":
        body = _protobuf(points).SerializeToString()
        r = httpx.post(f"{live.http}/v1/metrics", content=body, headers=PB, timeout=10)
        assert r.status_code == 200, r.text
        partial = ExportMetricsServiceResponse.FromString(r.content).partial_success
        return partial.rejected_data_points, partial.error_message
    doc = _json([_json_point(name, gpu, _json_value(v)) for name, gpu, v in points])
    return _post_json(live, doc)


def _post_json(live: Any, doc: dict[str, Any]) -> tuple[int, str]:
    r = httpx.post(f"{live.http}/v1/metrics", content=json.dumps(doc), headers=JSON, timeout=10)
    assert r.status_code == 200, r.text
    partial = r.json().get("partialSuccess", {})
    return int(partial.get("rejectedDataPoints", 0)), partial.get("errorMessage", "")


def _rows(live: Any) -> list[tuple[Any, ...]]:
    return live.rows(  # type: ignore[no-any-return]
        "SELECT gpu_index, ts_ns, utilization_pct, sm_clock_mhz, power_w, memory_used_bytes "
        "FROM gpu_samples ORDER BY gpu_index"
    )


@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json", "grpc"])
def test_nan_and_infinite_gpu_values_are_refused_and_the_rest_is_stored(
    tmp_path: Path, protocol: str
) -> None:
    live, stop = start_live(tmp_path)
    try:
        rejected, message = _export(live, protocol, GOOD + NOT_FINITE)
        assert rejected == len(NOT_FINITE)
        assert message == "utilization_pct: the value must be a finite number, got nan"
        assert _rows(live) == STORED
        assert live.collector.writer.write_errors == 0
    finally:
        stop()


#: (what the point holds, the reason it is refused for): each one bad point in an
#: OTLP/JSON export of good ones
BAD_JSON_POINTS: list[tuple[dict[str, Any], str]] = [
    ({"asDouble": 1.0, "timeUnixNano": "yesterday"},
     "timeUnixNano must be an integer, got 'yesterday'"),
    ({"asDouble": 1.0, "timeUnixNano": "-1"}, "timeUnixNano must be in 0..9223372036854775807, got -1"),
    ({"asDouble": 1.0, "timeUnixNano": str(2**64)},
     f"timeUnixNano must be in 0..9223372036854775807, got {2**64}"),
    ({"asDouble": 1.0, "timeUnixNano": True}, "timeUnixNano must be an integer, got True"),
    ({"asDouble": "fast"}, "asDouble must be a number, got 'fast'"),
    ({"asDouble": True}, "asDouble must be a number, got true"),
    ({"asDouble": {"v": 1}}, "asDouble must be a number, got {'v': 1}"),
    ({"asDouble": [1.0]}, "asDouble must be a number, got [1.0]"),
    ({"asInt": "12GB"}, "asInt must be an integer, got '12GB'"),
    ({"asInt": 1.5}, "asInt must be an integer, got 1.5"),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("fields", "why"), BAD_JSON_POINTS, ids=[w for _, w in BAD_JSON_POINTS])
def test_a_bad_json_data_point_is_refused_alone(
    tmp_path: Path, fields: dict[str, Any], why: str
) -> None:
    metrics = [_json_point(name, gpu, _json_value(v)) for name, gpu, v in GOOD]
    metrics.insert(1, _json_point(sc.METRIC_GPU_UTIL, 7, fields))  # between good ones
    live, stop = start_live(tmp_path)
    try:
        assert _post_json(live, _json(metrics)) == (1, f"utilization_pct: {why}")
        assert _rows(live) == STORED
    finally:
        stop()


def test_a_json_export_of_bad_points_only_is_a_partial_success_as_in_protobuf(
    tmp_path: Path,
) -> None:
    live, stop = start_live(tmp_path)
    try:
        metrics = [_json_point(sc.METRIC_GPU_POWER, 0, f) for f, _ in BAD_JSON_POINTS]
        rejected, message = _post_json(live, _json(metrics))
        assert rejected == len(BAD_JSON_POINTS)
        assert message == f"power_w: {BAD_JSON_POINTS[0][1]}"
        assert _rows(live) == []
    finally:
        stop()
