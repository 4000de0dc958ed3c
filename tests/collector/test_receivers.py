"""OTLP receivers over real sockets: the real OTel SDK exporters (gRPC and
http/protobuf, as vLLM exports), OTLP/JSON, metrics, partial success, limits."""

from __future__ import annotations

import gzip
import json

import grpc
import httpx
import pytest
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind
from otlp_traces import request_trace, to_json, to_protobuf

from tokentrace.instrumentation import semconv as sc

PB = {"Content-Type": "application/x-protobuf"}


def _exporter(protocol: str, live):  # type: ignore[no-untyped-def]
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=f"http://{live.grpc_target}", insecure=True)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    return Http(endpoint=f"{live.http}/v1/traces")


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_real_otel_exporter_lands_vllm_style_request(protocol: str, live) -> None:  # type: ignore[no-untyped-def]
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
    provider.add_span_processor(SimpleSpanProcessor(_exporter(protocol, live)))
    tracer = provider.get_tracer("vllm.tracing")
    with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER) as span:
        span.set_attribute("gen_ai.request.model", "opt-125m")
        span.set_attribute("gen_ai.latency.e2e", 0.5)
        span.set_attribute("gen_ai.latency.time_to_first_token", 0.1)
        span.set_attribute("gen_ai.latency.time_in_queue", 0.02)
        span.set_attribute("gen_ai.latency.time_in_model_prefill", 0.08)
        span.set_attribute("gen_ai.latency.time_in_model_decode", 0.4)
        span.set_attribute("gen_ai.usage.prompt_tokens", 10)
        span.set_attribute("gen_ai.usage.completion_tokens", 20)
        span.set_attribute("gen_ai.request.id", "cmpl-1")
        trace_id = format(span.get_span_context().trace_id, "032x")
    provider.shutdown()
    rows = live.rows("SELECT model, source, e2e_ms FROM requests WHERE trace_id = ?", [trace_id])
    assert rows == [("opt-125m", "vllm", pytest.approx(500.0))]
    text = httpx.get(f"{live.http}/metrics").text
    proto = "grpc" if protocol == "grpc" else "http"
    assert f'tokentrace_spans_accepted_total{{protocol="{proto}"}} 1.0' in text


@pytest.mark.parametrize("encoding", ["protobuf", "json", "protobuf+gzip"])
def test_http_encodings_answer_in_the_request_type(encoding: str, live) -> None:  # type: ignore[no-untyped-def]
    spans = request_trace()
    if encoding == "json":
        r = httpx.post(f"{live.http}/v1/traces", json=to_json(spans))
        assert r.headers["content-type"] == "application/json" and r.json() == {}
    else:
        body = to_protobuf(spans).SerializeToString()
        headers = dict(PB)
        if encoding.endswith("gzip"):
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        r = httpx.post(f"{live.http}/v1/traces", content=body, headers=headers)
        assert r.headers["content-type"] == "application/x-protobuf"
        assert not ExportTraceServiceResponse.FromString(r.content).HasField("partial_success")
    assert r.status_code == 200
    assert live.rows("SELECT count(*) FROM requests") == [(1,)]


def test_partial_success_names_rejected_spans(live) -> None:  # type: ignore[no-untyped-def]
    good = request_trace()
    export = to_protobuf(good)
    bad = export.resource_spans[0].scope_spans[0].spans.add()
    bad.trace_id = b"\x01" * 5  # not 16 bytes
    bad.span_id = b"\x02" * 8
    bad.name = "broken"
    r = httpx.post(f"{live.http}/v1/traces", content=export.SerializeToString(), headers=PB)
    assert r.status_code == 200
    partial = ExportTraceServiceResponse.FromString(r.content).partial_success
    assert partial.rejected_spans == 1 and "broken" in partial.error_message
    doc = to_json(request_trace())
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = "zz"
    r = httpx.post(f"{live.http}/v1/traces", json=doc)
    assert r.status_code == 200 and r.json()["partialSuccess"]["rejectedSpans"] == "1"
    # the valid spans of both exports landed
    assert live.rows("SELECT count(*) FROM requests") == [(2,)]


def test_grpc_partial_success_and_invalid_argument(live) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(live.grpc_target) as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        export = to_protobuf(request_trace())
        bad = export.resource_spans[0].scope_spans[0].spans.add()
        bad.trace_id, bad.span_id = b"\x01" * 16, b"\x02" * 3
        reply = stub.Export(export, timeout=5)
        assert reply.partial_success.rejected_spans == 1
        only_bad = to_protobuf([])
        only_bad.resource_spans[0].scope_spans[0].spans.append(bad)
        with pytest.raises(grpc.RpcError) as err:
            stub.Export(only_bad, timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.slow
def test_size_limits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from collector_testkit import start_live

    live, stop = start_live(tmp_path, max_body_bytes=4096)
    try:
        big = to_protobuf(request_trace(tokens=2000)).SerializeToString()
        assert len(big) > 4096
        r = httpx.post(f"{live.http}/v1/traces", content=big, headers=PB)
        assert r.status_code == 413
        assert "exceeds" in Status.FromString(r.content).message
        bomb = gzip.compress(b"\0" * 10_000_000)
        r = httpx.post(
            f"{live.http}/v1/traces", content=bomb, headers={**PB, "Content-Encoding": "gzip"}
        )
        assert r.status_code == 413
        with grpc.insecure_channel(live.grpc_target) as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.Export(to_protobuf(request_trace(tokens=2000)), timeout=5)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        stop()


@pytest.mark.slow
def test_bad_content_type_and_encoding(live) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(f"{live.http}/v1/traces", content=b"x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    r = httpx.post(
        f"{live.http}/v1/traces", content=b"x", headers={**PB, "Content-Encoding": "br"}
    )
    assert r.status_code == 415
    r = httpx.post(f"{live.http}/v1/traces", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "invalid JSON" in r.json()["message"]


def _gpu_export(ts: int) -> ExportMetricsServiceRequest:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    for k, v in ((sc.SERVICE_NAME, "worker"), (sc.SERVICE_INSTANCE, "w-1")):
        kv = rm.resource.attributes.add()
        kv.key, kv.value.string_value = k, v
    sm = rm.scope_metrics.add()
    for name, value in ((sc.METRIC_GPU_UTIL, 87.5), (sc.METRIC_GPU_MEM_USED, 2**33)):
        metric = sm.metrics.add()
        metric.name = name
        for gpu in (0, 1):
            dp = metric.gauge.data_points.add()
            dp.time_unix_nano = ts
            if isinstance(value, int):
                dp.as_int = value + gpu
            else:
                dp.as_double = value + gpu
            kv = dp.attributes.add()
            kv.key, kv.value.int_value = sc.GPU_INDEX, gpu
    other = sm.metrics.add()
    other.name = "http.server.duration"
    other.gauge.data_points.add().as_double = 1.0
    return req


def test_gpu_metrics_become_one_row_per_gpu_and_timestamp(live) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(
        f"{live.http}/v1/metrics", content=_gpu_export(1000).SerializeToString(), headers=PB
    )
    assert r.status_code == 200
    assert not ExportMetricsServiceResponse.FromString(r.content).HasField("partial_success")
    with grpc.insecure_channel(live.grpc_target) as channel:
        metrics_service_pb2_grpc.MetricsServiceStub(channel).Export(_gpu_export(2000), timeout=5)
    from google.protobuf.json_format import MessageToDict

    doc = MessageToDict(_gpu_export(3000))
    r = httpx.post(f"{live.http}/v1/metrics", content=json.dumps(doc),
                   headers={"Content-Type": "application/json"})  # fmt: skip
    assert r.status_code == 200 and r.json() == {}
    rows = live.rows(
        "SELECT service, instance, gpu_index, ts_ns, utilization_pct, memory_used_bytes, power_w "
        "FROM gpu_samples ORDER BY ts_ns, gpu_index"
    )
    assert len(rows) == 6
    assert rows[:2] == [
        ("worker", "w-1", 0, 1000, 87.5, 2**33, None),
        ("worker", "w-1", 1, 1000, 88.5, 2**33 + 1, None),
    ]


# ---- Host (DNS rebinding) ---------------------------------------------------------------

FOREIGN_HOSTS = ("rebind.example:4318", "rebind.example", "127.0.0.1.rebind.example", "127.0.0.1:1@x", "[::1")


@pytest.mark.slow
def test_a_host_of_another_name_may_not_post_traces(live) -> None:  # type: ignore[no-untyped-def]
    """A page whose name is re-pointed at 127.0.0.1 could post made-up traces: refused, stored nothing."""
    body = to_protobuf(request_trace()).SerializeToString()
    for host in FOREIGN_HOSTS:
        r = httpx.post(f"{live.http}/v1/traces", content=body, headers={**PB, "Host": host})
        assert r.status_code == 403, (host, r.status_code)
        status = Status.FromString(r.content)  # OTLP: errors carry a google.rpc.Status
        assert status.code == 7 and "DNS rebinding" in status.message, host
        r = httpx.post(f"{live.http}/v1/traces", json=to_json(request_trace()), headers={"Host": host})
        assert r.status_code == 403 and "DNS rebinding" in r.json()["message"]
    assert httpx.get(f"{live.http}/metrics", headers={"Host": "rebind.example"}).status_code == 403
    assert live.rows("SELECT count(*) FROM requests") == [(0,)]
    port = live.http_port
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        body = to_protobuf(request_trace()).SerializeToString()
        r = httpx.post(f"{live.http}/v1/traces", content=body, headers={**PB, "Host": host})
        assert r.status_code == 200, (host, r.text)
    assert live.rows("SELECT count(*) FROM requests") == [(3,)]


@pytest.mark.slow
def test_bound_to_another_address_the_receiver_takes_any_host(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from collector_testkit import start_live
    from tt_testkit import ThreadServer

    from tokentrace.collector.http_receiver import create_http_app

    live, stop = start_live(tmp_path)
    try:
        c = live.collector
        app = create_http_app(c.pipeline, c.settings.max_body_bytes, c.metrics, bind_host="0.0.0.0")  # noqa: S104
        with ThreadServer(app) as server:
            body = to_protobuf(request_trace()).SerializeToString()
            r = httpx.post(f"{server.url}/v1/traces", content=body, headers={**PB, "Host": "collector.lan:4318"})
            assert r.status_code == 200
        assert live.rows("SELECT count(*) FROM requests") == [(1,)]
    finally:
        stop()
