"""Values no store column or Prometheus label can hold are repaired or dropped as
they are decoded, not left to fail later: a lone UTF-16 surrogate in an OTLP/JSON
string (security review: `metrics_surrogate.py`, `writer_crash.py`) becomes
U+FFFD, and an engine step's count beyond the INTEGER column (`writer_crash_proto.py`)
is not measured (0)."""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from otlp_traces import request_trace, to_json, to_protobuf

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.engine_steps import extract_engine_steps
from tokentrace.analyzer.spans import Span
from tokentrace.collector.otlp import OtlpDecodeError, decode_json_partial, decode_protobuf_partial
from tokentrace.collector.otlp_metrics import decode_metrics_json
from tokentrace.collector.self_metrics import CollectorMetrics, RequestHistograms
from tokentrace.instrumentation import semconv as sc

LONE = "\ud800"
REPAIRED = "\ufffd"


def _strings(value: Any) -> list[str]:
    """Every str in a decoded value (dict keys included)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _span_strings(span: Span) -> list[str]:
    return [
        span.name, span.status_message, span.scope,
        *_strings(span.attributes), *_strings(span.resource),
        *(s for e in span.events for s in (e.name, *_strings(e.attributes))),
        *(s for lk in span.links for s in _strings(lk.attributes)),
    ]  # fmt: skip


def _hostile_doc() -> dict[str, Any]:
    doc = to_json(request_trace(model="MODEL", attributes={"tenant": "acme"}))
    rs = doc["resourceSpans"][0]
    rs["resource"]["attributes"].append({"key": "host" + LONE, "value": {"stringValue": "h" + LONE}})
    ss = rs["scopeSpans"][0]
    ss["scope"] = {"name": "scope" + LONE}
    ss["spans"][0]["name"] = LONE + "é"  # a child: the request span keeps its conventional name
    span = ss["spans"][-1]
    span["status"] = {"code": 2, "message": "boom \udfff"}
    span["attributes"] += [
        {"key": "k" + LONE, "value": {"stringValue": "v"}},
        {"key": "list", "value": {"arrayValue": {"values": [{"stringValue": LONE}]}}},
        {"key": "kv", "value": {"kvlistValue": {"values": [{"key": LONE, "value": {"stringValue": LONE}}]}}},
        {"key": "bytes", "value": {"bytesValue": "\udc80"}},
    ]
    span["events"] = [{"name": "ev" + LONE, "timeUnixNano": span["startTimeUnixNano"],
                       "attributes": [{"key": "a", "value": {"stringValue": "\udbff!"}}]}]  # fmt: skip
    span["links"] = [{"traceId": "ab" * 16, "spanId": "cd" * 8,
                      "attributes": [{"key": "l" + LONE, "value": {"stringValue": LONE}}]}]  # fmt: skip
    # the model name, as the security review sent it
    text = json.dumps(doc).replace("MODEL", "\\ud800")
    return json.loads(text)  # type: ignore[no-any-return]


def test_json_strings_with_lone_surrogates_are_repaired() -> None:
    spans, rejected = decode_json_partial(_hostile_doc())
    assert not rejected
    strings = [s for span in spans for s in _span_strings(span)]
    for s in strings:
        s.encode()  # every one encodes as UTF-8 now
    assert sum(REPAIRED in s for s in strings) >= 15
    assert spans[0].name == REPAIRED + "é"
    root = spans[-1]
    assert root.status_message == "boom " + REPAIRED
    assert root.attributes["k" + REPAIRED] == "v"
    assert root.attributes["list"] == [REPAIRED]
    assert root.attributes["kv"] == {REPAIRED: REPAIRED}
    assert root.resource["host" + REPAIRED] == "h" + REPAIRED
    assert root.scope == "scope" + REPAIRED
    assert summarize_trace(spans).requests[0].model == REPAIRED
    # valid non-ASCII text and surrogate pairs are left alone
    ok = to_json(request_trace(attributes={"tenant": "zürich 😀"}))
    spans, _ = decode_json_partial(json.loads(json.dumps(ok)))  # "\ud83d\ude00": a pair
    assert spans[-1].attributes["tenant"] == "zürich 😀"


def test_gpu_sample_strings_from_json_are_repaired() -> None:
    doc = {"resourceMetrics": [{
        "resource": {"attributes": [{"key": sc.SERVICE_NAME, "value": {"stringValue": "gpu" + LONE}}]},
        "scopeMetrics": [{"metrics": [{"name": "tokentrace.gpu.utilization", "gauge": {"dataPoints": [
            {"asDouble": 50.0, "timeUnixNano": "1700000000000000000",
             "attributes": [{"key": "gpu.index", "value": {"intValue": "0"}}]}]}}]}],
    }]}  # fmt: skip
    result = decode_metrics_json(doc)
    assert result.rows and result.rows[0]["service"] == "gpu" + REPAIRED


def test_protobuf_strings_that_are_not_utf8_are_refused() -> None:
    # proto3 strings must be UTF-8: upb refuses the encoded surrogate (ED A0 80), so
    # no protobuf export can carry one (the export is a 400, nothing is stored)
    body = to_protobuf(request_trace(model="MODEL")).SerializeToString()
    with pytest.raises(OtlpDecodeError, match="UTF-8"):
        decode_protobuf_partial(body.replace(b"MODEL", b"\xed\xa0\x80AB"))


def test_a_label_that_cannot_be_encoded_does_not_break_the_scrape() -> None:
    metrics = CollectorMetrics()
    request = summarize_trace(request_trace()).requests[0]
    request.model = "m" + LONE  # past the decoder: the label path must cope on its own
    metrics.observe_requests([request])
    metrics.observe_requests([request])  # the fast path (a value seen before) too
    body, _ = metrics.render()
    assert f'tokentrace_request_e2e_seconds_count{{model="m{REPAIRED}"}} 2.0' in body.decode()

    histograms = RequestHistograms()
    histograms.observe([request])
    assert {s.labels["model"] for m in histograms.collect() for s in m.samples} == {"m" + REPAIRED}


def test_an_unencodable_label_from_elsewhere_is_repaired_at_render() -> None:
    from prometheus_client import Gauge

    metrics = CollectorMetrics()
    Gauge("tt_test_labels", "a label value with a lone surrogate", ["v"],
          registry=metrics.registry).labels("x" + LONE).set(1)  # fmt: skip
    body, _ = metrics.render()
    assert f'tt_test_labels{{v="x{REPAIRED}"}} 1.0' in body.decode()


def test_lone_surrogates_at_a_live_collector(live: Any) -> None:
    # the security review's metrics_surrogate.py and writer_crash.py: a model and a
    # tenant holding "\ud800", as escapes in the JSON text and as raw bytes
    doc = to_json(request_trace(model="MODEL", attributes={sc.TENANT: "TENANT"}, service="hostile"))
    body = json.dumps(doc).replace("MODEL", "\\ud800").replace("TENANT", "t-\\udfff").encode()
    raw = json.dumps(to_json(request_trace(model="RAWMODEL", service="raw"))).encode()
    raw = raw.replace(b"RAWMODEL", b"\xed\xa0\x80")  # what Python's json reads as "\ud800"
    for content in (body, raw):
        r = httpx.post(f"{live.http}/v1/traces", content=content,
                       headers={"Content-Type": "application/json"}, timeout=10)  # fmt: skip
        assert r.status_code == 200, r.text
    later = to_json(request_trace(service="later"))
    assert httpx.post(f"{live.http}/v1/traces", json=later, timeout=10).status_code == 200
    rows = live.rows("SELECT service, model, tenant FROM requests ORDER BY service")
    assert rows == [("hostile", REPAIRED, "t-" + REPAIRED), ("later", "m", ""), ("raw", REPAIRED, "")]
    assert live.collector.writer.write_errors == 0
    for _ in range(2):
        scrape = httpx.get(f"{live.http}/metrics", timeout=10)
        assert scrape.status_code == 200
        assert f'model="{REPAIRED}"' in scrape.text


def _steps_span(**lists: list[Any]) -> Span:
    return Span(
        trace_id="ab" * 16, span_id="cd" * 8, parent_span_id="", name=sc.SPAN_ENGINE_STEPS,
        kind=1, start_ns=1, end_ns=2,
        attributes={key: sc.pack_list(values) for key, values in lists.items()},
        resource={sc.SERVICE_NAME: "engine"},
    )  # fmt: skip


def test_engine_step_values_beyond_their_columns_are_not_measured() -> None:
    t = 1_700_000_000_000_000_000
    span = _steps_span(**{
        sc.STEP_START_NS: [t, t + 1, 2**63, t + 3],
        sc.STEP_PREFILL_TOKENS: [2**40, 2**31 - 1, 5, -3],
        sc.STEP_DECODE_SEQS: [2**31, 4, 5, 6],
        sc.STEP_BATCH_SIZE: [-1, 8, 5, 1e300],
        sc.STEP_QUEUE_DEPTH: [2**64, 0, 5, 3],
        sc.STEP_DURATION_US: [2**63, 10, 5, -10],
        sc.STEP_GPU_US: [1e300, 9.0, 5, math.inf],
    })  # fmt: skip
    steps = extract_engine_steps([span])
    assert [s.start_ns for s in steps] == [t, t + 1, t + 3]  # 2**63 ns is no time: no step
    # a count that cannot be one is not measured: NULL, not 0 (a real empty queue)
    assert [s.prefill_tokens for s in steps] == [None, 2**31 - 1, None]
    assert [s.decode_seqs for s in steps] == [None, 4, 6]
    assert [s.batch_size for s in steps] == [None, 8, None]
    assert [s.queue_depth for s in steps] == [None, 0, 3]
    assert [s.duration_us for s in steps] == [0, 10, -10]
    assert [s.gpu_us for s in steps] == [None, 9, None]


def test_tgi_batch_sizes_beyond_integer_are_not_measured() -> None:
    batch = Span(trace_id="ab" * 16, span_id="01" * 8, parent_span_id="", name="batch", kind=1,
                 start_ns=1, end_ns=5000, attributes={"batch_size": 3})  # fmt: skip
    sizes = [2**40, math.inf, "7"]
    children = [
        Span(trace_id="ab" * 16, span_id=f"{i + 2:02x}" * 8, parent_span_id="01" * 8, name="decode",
             kind=1, start_ns=10, end_ns=2000, attributes={"size": size})  # fmt: skip
        for i, size in enumerate(sizes)
    ]
    assert [s.batch_size for s in extract_engine_steps([batch, *children])] == [None, None, 7]


def test_an_engine_step_count_beyond_integer_at_a_live_collector(live: Any) -> None:
    # the security review's writer_crash_proto.py: a 214-byte protobuf export
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key=sc.SERVICE_NAME, value=AnyValue(string_value="engine"))
    sp = rs.scope_spans.add().spans.add()
    sp.trace_id, sp.span_id, sp.name = random.randbytes(16), random.randbytes(8), sc.SPAN_ENGINE_STEPS
    sp.start_time_unix_nano = time.time_ns()
    sp.end_time_unix_nano = sp.start_time_unix_nano + 1000
    for key, values in ((sc.STEP_START_NS, [time.time_ns()]), (sc.STEP_PREFILL_TOKENS, [2**40])):
        sp.attributes.add(key=key, value=AnyValue(string_value=sc.pack_list(values)))
    r = httpx.post(f"{live.http}/v1/traces", content=req.SerializeToString(),
                   headers={"Content-Type": "application/x-protobuf"}, timeout=10)  # fmt: skip
    assert r.status_code == 200
    later = to_json(request_trace(service="later"))
    assert httpx.post(f"{live.http}/v1/traces", json=later, timeout=10).status_code == 200
    assert live.rows("SELECT service, prefill_tokens FROM engine_steps") == [("engine", None)]
    assert live.rows("SELECT service FROM requests") == [("later",)]
    assert live.collector.writer.write_errors == 0


def test_files_are_read_from_disk_the_same_way(tmp_path: Path) -> None:
    from tokentrace.collector.otlp_file import read_otlp_file

    path = tmp_path / "export.json"
    path.write_text(json.dumps(to_json(request_trace(model="MODEL"))).replace("MODEL", "\\ud800"))
    assert summarize_trace(read_otlp_file(path)).requests[0].model == REPAIRED
