"""OTLP metric exports (protobuf or JSON) decoded into `gpu_samples` rows.

The SDK's NVML sampler exports one gauge per quantity (`METRIC_GPU_*`), each
data point carrying `gpu.index` and its own timestamp.  The data points of one
(resource, GPU, timestamp) become one row.  Metrics that are not GPU samples
are counted and ignored: the collector is not a general metrics store.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from tokentrace.collector.otlp import (
    MAX_NS,
    OtlpDecodeError,
    _attrs,
    _j_attrs,
    _j_int,
    _j_list,
    _j_obj,
    parse_json_body,
)
from tokentrace.instrumentation import semconv as sc

#: gpu_samples column of each GPU gauge, and whether it holds an integer.
GPU_COLUMNS: dict[str, tuple[str, bool]] = {
    sc.METRIC_GPU_UTIL: ("utilization_pct", False),
    sc.METRIC_GPU_MEM_USED: ("memory_used_bytes", True),
    sc.METRIC_GPU_MEM_TOTAL: ("memory_total_bytes", True),
    sc.METRIC_GPU_SM_CLOCK: ("sm_clock_mhz", False),
    sc.METRIC_GPU_POWER: ("power_w", False),
}
#: Every column of a gpu_samples row, in table order.
ROW_KEYS: tuple[str, ...] = (
    "service",
    "instance",
    "gpu_index",
    "ts_ns",
    *(col for col, _ in GPU_COLUMNS.values()),
)
#: What the gpu_samples columns hold (store/schema.py): `gpu_index` is an
#: INTEGER, the byte counts BIGINTs.  A value beyond them is no GPU sample, and DuckDB
#: would refuse its row at the writer (which drops it, and logs): it is refused here,
#: with its reason, as a data point of the export (OTLP partial success).  Neither an
#: index nor a byte count is ever below zero.
MAX_GPU_INDEX = 2**31 - 1
MAX_BYTES = 2**63 - 1


@dataclass(slots=True)
class MetricsResult:
    rows: list[dict[str, Any]] = field(default_factory=list)
    rejected_points: int = 0
    ignored_metrics: int = 0
    message: str = ""


class _Rows:
    """Groups data points into one row per (service, instance, gpu index, timestamp)."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[str, str, int, int], dict[str, Any]] = {}
        self.result = MetricsResult()

    def point(
        self, service: str, instance: str, column: str, is_int: bool, attrs: Mapping[str, Any],
        ts_ns: int, value: float | int | None,
    ) -> None:  # fmt: skip
        gpu = attrs.get(sc.GPU_INDEX, 0)
        if value is None or isinstance(gpu, bool) or not isinstance(gpu, (int, str)):
            self.reject(f"{column}: data point needs a value and an integer {sc.GPU_INDEX}")
            return
        try:
            gpu_index = int(gpu)
        except ValueError:
            self.reject(f"{column}: {sc.GPU_INDEX} {gpu!r} is not an integer")
            return
        if not 0 <= gpu_index <= MAX_GPU_INDEX:
            self.reject(
                f"{column}: {sc.GPU_INDEX} must be in 0..{MAX_GPU_INDEX}, got {_brief(gpu_index)}"
            )
            return
        if ts_ns > MAX_NS:  # a protobuf fixed64 (OTLP/JSON's are checked as they are read)
            self.reject(f"{column}: time must be nanoseconds in 0..2^63-1, got {ts_ns}")
            return
        stored, why = _column_value(value, is_int)
        if why:
            self.reject(f"{column}: {why}")
            return
        key = (service, instance, gpu_index, ts_ns)
        row = self.by_key.get(key)
        if row is None:
            row = self.by_key[key] = dict.fromkeys(ROW_KEYS)
            row.update(service=service, instance=instance, gpu_index=gpu_index, ts_ns=ts_ns)
        row[column] = stored

    def reject(self, why: str) -> None:
        """Counts one data point refused (OTLP partial success); the first reason is kept."""
        self.result.rejected_points += 1
        if not self.result.message:
            self.result.message = why

    def done(self) -> MetricsResult:
        self.result.rows = list(self.by_key.values())
        return self.result


def _column_value(value: float | int, is_int: bool) -> tuple[float | int | None, str]:
    """Gives a data point's value as its column stores it, or why it cannot be stored:
    a byte count (`is_int`) must be a whole number of bytes in 0..MAX_BYTES (a double
    is truncated; NaN and infinities are none), any other value a finite double (a NaN
    utilization would make every mean over it NaN, an infinite power every sum)."""
    if not is_int:
        try:
            number = float(value)
        except OverflowError:  # an OTLP/JSON asInt beyond a double
            return None, f"the value must fit a double, got {_brief(value)}"
        if not math.isfinite(number):
            return None, f"the value must be a finite number, got {number}"
        return number, ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return None, f"a byte count must be a finite number, got {value}"
        value = int(value)
    if not 0 <= value <= MAX_BYTES:
        return None, f"a byte count must be in 0..2^63-1, got {_brief(value)}"
    return value, ""


def _brief(number: object) -> str:
    """Gives a number for a message: whole, or its first digits and its length."""
    text = str(number)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} characters)"


def _who(resource: Mapping[str, Any]) -> tuple[str, str]:
    return (
        str(resource.get(sc.SERVICE_NAME, "")),
        str(resource.get(sc.SERVICE_INSTANCE, resource.get(sc.PROCESS_PID, ""))),
    )


def parse_metrics_request(body: bytes) -> ExportMetricsServiceRequest:
    """Gives the parsed request, or OtlpDecodeError for bytes that are not one."""
    request = ExportMetricsServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise OtlpDecodeError(f"invalid OTLP metrics protobuf: {exc}") from exc
    return request


def gpu_rows_from_request(request: ExportMetricsServiceRequest) -> MetricsResult:
    """Gives the gpu_samples rows of a parsed protobuf metrics export."""
    rows = _Rows()
    for rm in request.resource_metrics:
        service, instance = _who(_attrs(rm.resource.attributes))
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                target = GPU_COLUMNS.get(metric.name)
                if target is None:
                    rows.result.ignored_metrics += 1
                    continue
                which = metric.WhichOneof("data")
                if which not in ("gauge", "sum"):
                    rows.result.ignored_metrics += 1
                    continue
                for dp in getattr(metric, which).data_points:
                    kind = dp.WhichOneof("value")
                    value = getattr(dp, kind) if kind else None
                    rows.point(service, instance, *target, _attrs(dp.attributes),
                               dp.time_unix_nano, value)  # fmt: skip
    return rows.done()


def decode_metrics_protobuf(body: bytes) -> MetricsResult:
    """Gives the gpu_samples rows of a protobuf `ExportMetricsServiceRequest`."""
    return gpu_rows_from_request(parse_metrics_request(body))


def _j_point_value(dp: Mapping[str, Any]) -> float | int | None:
    """Gives an OTLP/JSON data point's value, None when it has none.

    proto3 JSON writes a double as a number or a string ("1.5", "NaN", "Infinity")
    and an int64 as a string or a whole number; anything else (a bool, an object, a
    fraction for `asInt`) raises OtlpDecodeError saying what it got."""
    if "asDouble" in dp:
        raw = dp["asDouble"]
        if not isinstance(raw, bool) and isinstance(raw, (int, float, str)):
            try:
                return float(raw)
            except ValueError:  # not a number's spelling
                pass
            except OverflowError as exc:  # a JSON integer beyond a double
                raise OtlpDecodeError(f"asDouble must fit a double, got {_brief(raw)}") from exc
        raise OtlpDecodeError(f"asDouble must be a number, got {_brief_json(raw)}")
    if "asInt" in dp:
        raw = dp["asInt"]
        if isinstance(raw, float) and raw.is_integer():
            return int(raw)
        if not isinstance(raw, bool) and isinstance(raw, (int, str)):
            try:
                return int(raw)
            except ValueError:  # not digits, or more than int() reads
                pass
        raise OtlpDecodeError(f"asInt must be an integer, got {_brief_json(raw)}")
    return None


def _brief_json(raw: Any) -> str:
    """Gives a JSON value for a message: its JSON spelling, cut short."""
    text = json.dumps(raw) if isinstance(raw, (bool, type(None))) else repr(raw)
    return text if len(text) <= 40 else f"{text[:36]}..."


def decode_metrics_json(doc: Any) -> MetricsResult:
    """Gives the gpu_samples rows of an OTLP/JSON metrics export document.  `{}` is an
    export without metrics (proto3 JSON leaves out empty fields): no rows."""
    if not isinstance(doc, Mapping):
        raise OtlpDecodeError("OTLP JSON metrics body must be an object with resourceMetrics")
    rows = _Rows()
    for rm in _j_list(doc.get("resourceMetrics"), "resourceMetrics"):
        rm = _j_obj(rm, "resourceMetrics entry")
        service, instance = _who(_j_attrs(_j_obj(rm.get("resource"), "resource").get("attributes")))
        for sm in _j_list(rm.get("scopeMetrics"), "scopeMetrics"):
            for metric in _j_list(_j_obj(sm, "scopeMetrics entry").get("metrics"), "metrics"):
                metric = _j_obj(metric, "metric")
                target = GPU_COLUMNS.get(str(metric.get("name", "")))
                data = metric.get("gauge") or metric.get("sum")
                if target is None or data is None:
                    rows.result.ignored_metrics += 1
                    continue
                for dp in _j_list(_j_obj(data, "gauge").get("dataPoints"), "dataPoints"):
                    # what is wrong inside one data point refuses that point alone (OTLP
                    # partial success), as protobuf's range checks in `_Rows.point` do
                    try:
                        dp = _j_obj(dp, "data point")
                        value = _j_point_value(dp)
                        ts = _j_int(dp.get("timeUnixNano", 0), "timeUnixNano")
                        attrs = _j_attrs(dp.get("attributes"))
                    except OtlpDecodeError as exc:
                        rows.reject(f"{target[0]}: {exc}")
                        continue
                    rows.point(service, instance, *target, attrs, ts, value)
    return rows.done()


def decode_metrics_json_body(body: bytes) -> MetricsResult:
    """Gives the gpu_samples rows of an OTLP/JSON metrics request body."""
    return decode_metrics_json(parse_json_body(body))
