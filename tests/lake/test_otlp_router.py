"""The test-side router (tests/lake/otlp_router.py) splits as the loadbalancing exporter does:
every span once, a trace on one backend, resource and scope kept; metrics whole by service."""

from __future__ import annotations

import random

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from otlp_router import OtlpRouter

BACKENDS = [f"http://127.0.0.1:{port}" for port in (4318, 4328, 4338, 4348)]


def _export(rng: random.Random) -> ExportTraceServiceRequest:
    """Two resources, two scopes each, 50 traces of 3 spans spread over them."""
    request = ExportTraceServiceRequest()
    trace_ids = [rng.randbytes(16) for _ in range(50)]
    for r in range(2):
        rs = request.resource_spans.add()
        rs.resource.attributes.add(key="service.name", value=AnyValue(string_value=f"svc-{r}"))
        for s in range(2):
            ss = rs.scope_spans.add()
            ss.scope.name = f"scope-{s}"
            for trace_id in trace_ids:
                span = ss.spans.add()
                span.trace_id, span.span_id, span.name = trace_id, rng.randbytes(8), "x"
    return request


def _placed(request: ExportTraceServiceRequest) -> set[tuple[str, str, bytes, bytes]]:
    return {
        (rs.resource.attributes[0].value.string_value, ss.scope.name, span.trace_id, span.span_id)
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    }


def test_every_span_goes_once_to_its_traces_backend_under_its_resource_and_scope() -> None:
    router = OtlpRouter(BACKENDS)
    request = _export(random.Random(23))
    parts = router.split_traces(request.SerializeToString())
    assert len(parts) == len(BACKENDS)  # 50 traces reach every one of 4
    seen: list[tuple[str, str, bytes, bytes]] = []
    for b, part in parts.items():
        for placed in _placed(part):
            assert router.backend_of(placed[2]) == b
            seen.append(placed)
        assert len(part.resource_spans) <= 2  # one copy of a resource per part
    assert sorted(seen) == sorted(_placed(request))


def test_removing_a_backend_moves_only_the_traces_it_held() -> None:
    before, after = OtlpRouter(BACKENDS), OtlpRouter(BACKENDS[:3])
    ids = [random.Random(i).randbytes(16) for i in range(2000)]
    moved = [i for i in ids if before.backend_of(i) != after.backend_of(i)]
    assert moved and all(before.backend_of(i) == 3 for i in moved)


def test_metrics_go_whole_to_the_backend_of_their_service() -> None:
    router = OtlpRouter(BACKENDS)
    request = ExportMetricsServiceRequest()
    for name in ("llm-a", "llm-b", "llm-c"):
        rm = request.resource_metrics.add()
        rm.resource.attributes.append(
            KeyValue(key="service.name", value=AnyValue(string_value=name))
        )
        rm.scope_metrics.add().metrics.add().name = "gpu.utilization"
    parts = router.split_metrics(request.SerializeToString())
    got = {
        rm.resource.attributes[0].value.string_value: b
        for b, part in parts.items()
        for rm in part.resource_metrics
    }
    assert got == {name: router.backend_of(name.encode()) for name in ("llm-a", "llm-b", "llm-c")}
