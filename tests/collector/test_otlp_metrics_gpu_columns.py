"""GPU samples whose values the gpu_samples columns cannot hold (an INTEGER `gpu_index`,
BIGINT byte counts and time) are refused at decode time, one data point each with its
reason (OTLP partial success), and the rest of the export is stored: the writer never
meets them (it would drop their rows, and log)."""

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

from tokentrace.instrumentation import semconv as sc

PB = {"Content-Type": "application/x-protobuf"}
TS = 1_700_000_000_000_000_000

#: (metric, gpu.index, value, time): the good points first, then one bad one per line
POINTS: list[tuple[str, Any, float | int, int]] = [
    (sc.METRIC_GPU_UTIL, 0, 50.0, TS),
    (sc.METRIC_GPU_MEM_USED, 0, 2**33, TS),
    (sc.METRIC_GPU_MEM_TOTAL, 0, 2**34, TS),
    (sc.METRIC_GPU_UTIL, 1, 60.0, TS),
    (sc.METRIC_GPU_UTIL, 2, 70.0, TS),
    (sc.METRIC_GPU_MEM_TOTAL, 2, 8.0e10, TS),  # a double byte count: a whole number, stored
    # refused:
    (sc.METRIC_GPU_UTIL, 2**31, 1.0, TS),  # beyond the INTEGER gpu_index
    (sc.METRIC_GPU_UTIL, -1, 1.0, TS),
    (sc.METRIC_GPU_UTIL, "99999999999", 1.0, TS),  # a string index, beyond it too
    (sc.METRIC_GPU_MEM_USED, 1, -5, TS),  # a byte count below zero
    (sc.METRIC_GPU_MEM_TOTAL, 1, 1e19, TS),  # beyond the BIGINT
    (sc.METRIC_GPU_MEM_USED, 2, math.nan, TS),
    (sc.METRIC_GPU_MEM_USED, 3, math.inf, TS),
    (sc.METRIC_GPU_UTIL, 4, 1.0, 2**64 - 1),  # a fixed64 time beyond the BIGINT
]
REFUSED = 8


def _export(points: list[tuple[str, Any, float | int, int]]) -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    for k, v in ((sc.SERVICE_NAME, "worker"), (sc.SERVICE_INSTANCE, "w-1")):
        kv = rm.resource.attributes.add()
        kv.key, kv.value.string_value = k, v
    sm = rm.scope_metrics.add()
    for name, gpu, value, ts in points:
        metric = sm.metrics.add()
        metric.name = name
        dp = metric.gauge.data_points.add()
        dp.time_unix_nano = ts
        if isinstance(value, int):
            dp.as_int = value
        else:
            dp.as_double = value
        kv = dp.attributes.add()
        kv.key = sc.GPU_INDEX
        if isinstance(gpu, str):
            kv.value.string_value = gpu
        else:
            kv.value.int_value = gpu
    return req


def _rows(live: Any) -> list[tuple[Any, ...]]:
    return live.rows(  # type: ignore[no-any-return]
        "SELECT gpu_index, ts_ns, utilization_pct, memory_used_bytes, memory_total_bytes "
        "FROM gpu_samples ORDER BY gpu_index"
    )


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_gpu_points_beyond_their_columns_are_refused_and_the_rest_is_stored(
    tmp_path: Path, protocol: str
) -> None:
    live, stop = start_live(tmp_path)
    try:
        body = _export(POINTS)
        if protocol == "grpc":
            with grpc.insecure_channel(live.grpc_target) as channel:
                reply = metrics_service_pb2_grpc.MetricsServiceStub(channel).Export(
                    body, timeout=10
                )
        else:
            r = httpx.post(
                f"{live.http}/v1/metrics", content=body.SerializeToString(), headers=PB, timeout=10
            )
            assert r.status_code == 200, r.text
            reply = ExportMetricsServiceResponse.FromString(r.content)
        assert reply.partial_success.rejected_data_points == REFUSED
        # the first reason, for the sender
        assert f"{sc.GPU_INDEX} must be in 0..{2**31 - 1}, got {2**31}" in (
            reply.partial_success.error_message
        )
        assert _rows(live) == [
            (0, TS, 50.0, 2**33, 2**34),
            (1, TS, 60.0, None, None),
            (2, TS, 70.0, None, 80_000_000_000),
        ]
        assert live.collector.writer.write_errors == 0
    finally:
        stop()


def test_each_reason_names_the_column_and_the_value() -> None:
    from tokentrace.collector.otlp_metrics import gpu_rows_from_request

    messages = []
    for point in POINTS[6:]:
        result = gpu_rows_from_request(_export([point]))
        assert (result.rows, result.rejected_points) == ([], 1), point
        messages.append(result.message)
    assert messages == [
        f"utilization_pct: gpu.index must be in 0..2147483647, got {2**31}",
        "utilization_pct: gpu.index must be in 0..2147483647, got -1",
        "utilization_pct: gpu.index must be in 0..2147483647, got 99999999999",
        "memory_used_bytes: a byte count must be in 0..2^63-1, got -5",
        "memory_total_bytes: a byte count must be in 0..2^63-1, got 10000000000000000000",
        "memory_used_bytes: a byte count must be a finite number, got nan",
        "memory_used_bytes: a byte count must be a finite number, got inf",
        f"utilization_pct: time must be nanoseconds in 0..2^63-1, got {2**64 - 1}",
    ]


def test_json_gpu_points_beyond_their_columns_are_refused_the_same_way(tmp_path: Path) -> None:
    def point(name: str, gpu: str, value: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": name,
            "gauge": {
                "dataPoints": [
                    {
                        "timeUnixNano": str(TS),
                        "attributes": [{"key": sc.GPU_INDEX, "value": {"intValue": gpu}}],
                        **value,
                    }
                ]
            },
        }

    doc = {
        "resourceMetrics": [
            {
                "resource": {
                    "attributes": [{"key": sc.SERVICE_NAME, "value": {"stringValue": "w"}}]
                },
                "scopeMetrics": [
                    {
                        "metrics": [
                            point(sc.METRIC_GPU_UTIL, "0", {"asDouble": 40.0}),
                            point(sc.METRIC_GPU_MEM_USED, "0", {"asInt": str(2**40)}),
                            point(sc.METRIC_GPU_UTIL, str(2**40), {"asDouble": 1.0}),
                            point(sc.METRIC_GPU_MEM_USED, "1", {"asInt": str(2**63)}),
                            # an int no double holds, for a double column
                            point(sc.METRIC_GPU_POWER, "1", {"asInt": "9" * 400}),
                        ]
                    }
                ],
            }
        ]
    }
    live, stop = start_live(tmp_path)
    try:
        r = httpx.post(
            f"{live.http}/v1/metrics", content=json.dumps(doc),
            headers={"Content-Type": "application/json"}, timeout=10,
        )  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["partialSuccess"]["rejectedDataPoints"] == "3"
        assert _rows(live) == [(0, TS, 40.0, 2**40, None)]
        assert live.collector.writer.write_errors == 0
    finally:
        stop()
