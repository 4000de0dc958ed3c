"""What the OTLP spec asks of a receiver, beyond the happy path: an empty export is a
success; every 4xx (404 and 405 too) carries a `google.rpc.Status`; a path with a trailing
`/` is served, not redirected; 20 MiB bodies are taken; a root whose parent id is 8 zero
bytes is a root; and a big JSON export is not decoded on the event loop."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from collector_testkit import LiveCollector, start_live
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from otlp_traces import new_id, request_trace, to_json, to_protobuf

from tokentrace.collector import otlp
from tokentrace.collector.settings import CollectorSettings

PB = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}
MiB = 1024 * 1024


# ---- (a) an empty export ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1/traces", "/v1/metrics"])
@pytest.mark.parametrize("body", ["{}", '{"unknownField": 1}'])
def test_an_empty_json_export_is_a_success(path: str, body: str, live: LiveCollector) -> None:
    r = httpx.post(f"{live.http}{path}", content=body, headers=JSON)
    assert (r.status_code, r.json()) == (200, {})


def test_import_still_refuses_a_json_file_that_is_no_export() -> None:
    with pytest.raises(otlp.OtlpDecodeError, match="no resourceSpans"):
        otlp.decode_json({"data": []})


# ---- (b) 404 and 405 carry a google.rpc.Status ---------------------------------------------


@pytest.mark.parametrize("path", ["/v1/unknown", "/v1/profiles", "//v1/traces"])
def test_an_unknown_path_is_a_status_in_the_request_type(path: str, live: LiveCollector) -> None:
    r = httpx.post(f"{live.http}{path}", content=b"", headers=PB)
    assert r.status_code == 404 and r.headers["content-type"] == PB["Content-Type"]
    status = Status.FromString(r.content)
    assert status.code == grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert status.message.startswith(f"no endpoint at {path}:")
    assert "/v1/traces" in status.message and "/v1/logs" in status.message
    r = httpx.post(f"{live.http}{path}", content=b"{}", headers=JSON)
    assert r.status_code == 404 and r.headers["content-type"] == JSON["Content-Type"]
    assert r.json()["code"] == 12 and "/v1/metrics" in r.json()["message"]
    text = httpx.get(f"{live.http}/metrics").text
    assert 'tokentrace_exports_refused_total{protocol="http",status="404"} 2.0' in text


def test_a_method_not_taken_is_a_status_with_allow(live: LiveCollector) -> None:
    r = httpx.get(f"{live.http}/v1/traces")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert "GET is not allowed on /v1/traces" in Status.FromString(r.content).message
    r = httpx.put(f"{live.http}/v1/metrics", content=b"{}", headers=JSON)
    assert r.status_code == 405 and r.json()["code"] == 12


# ---- (c) a trailing slash -------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["protobuf", "json"])
def test_a_trailing_slash_is_served_not_redirected(content_type: str, live: LiveCollector) -> None:
    spans = request_trace()
    if content_type == "json":
        r = httpx.post(f"{live.http}/v1/traces/", json=to_json(spans))
    else:
        r = httpx.post(
            f"{live.http}/v1/traces/", content=to_protobuf(spans).SerializeToString(), headers=PB
        )
    assert r.status_code == 200  # OkHttp does not follow a 307 for a POST
    for path in ("/v1/metrics/", "/v1/logs/"):
        assert httpx.post(f"{live.http}{path}", content=b"", headers=PB).status_code == 200
    assert live.rows("SELECT trace_id FROM requests") == [(spans[0].trace_id,)]


# ---- (d) 20 MiB -------------------------------------------------------------------------------


def _export_of_size(size: int) -> tuple[str, bytes]:
    spans = request_trace(attributes={"big": "x" * size})
    return spans[0].trace_id, to_protobuf(spans).SerializeToString()


@pytest.mark.slow
def test_the_default_bound_takes_the_20_mib_otlp_recommends(live: LiveCollector) -> None:
    assert CollectorSettings().max_body_bytes == 20 * MiB
    over_16, body = _export_of_size(18 * MiB)
    r = httpx.post(f"{live.http}/v1/traces", content=body, headers=PB, timeout=60)
    assert r.status_code == 200, r.content
    with grpc.insecure_channel(live.grpc_target) as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        spans = request_trace(attributes={"big": "y" * (18 * MiB)})
        stub.Export(to_protobuf(spans), timeout=60)
    assert len(live.rows("SELECT trace_id FROM requests")) == 2
    _, too_big = _export_of_size(20 * MiB)
    r = httpx.post(f"{live.http}/v1/traces", content=too_big, headers=PB, timeout=60)
    assert r.status_code == 413


# ---- (e) a parent id of 8 zero bytes ------------------------------------------------------------


def _zero_parent_export(how: str) -> tuple[str, Any]:
    """A one-span trace whose root says parent 0000000000000000 (older exporters)."""
    (root,) = [s for s in request_trace() if not s.parent_span_id]
    root.kind = 1  # INTERNAL, like TGI's handler span: only "no parent" makes it the root
    if how == "json":
        doc = to_json([root])
        doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["parentSpanId"] = "0" * 16
        return root.trace_id, doc
    export = to_protobuf([root])
    export.resource_spans[0].scope_spans[0].spans[0].parent_span_id = bytes(8)
    return root.trace_id, export


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "offload"),
    [("protobuf", False), ("protobuf", True), ("json", False), ("json", True), ("grpc", False)],
    ids=[
        "http-protobuf",
        "http-protobuf-decode-worker",
        "http-json",
        "http-json-decode-worker",
        "grpc",
    ],
)
def test_a_zero_parent_id_makes_a_root(how: str, offload: bool, tmp_path: Path) -> None:
    live, stop = start_live(tmp_path, offload=offload, grace_s=0.2, decision_wait_s=120)
    try:
        trace_id, export = _zero_parent_export(how)
        if how == "grpc":
            with grpc.insecure_channel(live.grpc_target) as channel:
                trace_service_pb2_grpc.TraceServiceStub(channel).Export(export, timeout=10)
        elif how == "json":
            assert httpx.post(f"{live.http}/v1/traces", json=export, timeout=60).status_code == 200
        else:
            r = httpx.post(
                f"{live.http}/v1/traces", content=export.SerializeToString(), headers=PB, timeout=60
            )
            assert r.status_code == 200
        pipeline = live.collector.pipeline
        # decided after the grace period (0.2 s), as a root is; not after decision_wait_s
        # (120 s): waited for up to 60 s, as a loaded machine's decider thread may run late
        pause = threading.Event()
        for _ in range(1200):
            if pipeline.buffered_traces == 0:
                break
            pause.wait(0.05)
        assert pipeline.buffered_traces == 0, "the trace waits for a parent that never comes"
        assert live.rows("SELECT parent_span_id FROM spans WHERE trace_id = ?", [trace_id]) in (
            [],
            [("",)],
        )
        (flags,) = live.rows("SELECT flags FROM requests WHERE trace_id = ?", [trace_id])[0]
        assert "root_missing" not in flags
    finally:
        stop()


def test_the_decoders_read_a_zero_parent_as_none() -> None:
    trace_id, export = _zero_parent_export("protobuf")
    (span,), _ = otlp.decode_protobuf_partial(export.SerializeToString())
    assert span.parent_span_id == ""
    _, doc = _zero_parent_export("json")
    (span,), _ = otlp.decode_json_partial(doc)
    assert span.parent_span_id == ""
    # any other parent id stays what it is
    parent = new_id(8)
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["parentSpanId"] = parent
    (span,), _ = otlp.decode_json_partial(doc)
    assert span.parent_span_id == parent


# ---- (f) a big JSON export is decoded off the event loop ---------------------------------------


def _big_json_export(spans: int = 400) -> bytes:
    traces = [request_trace() for _ in range(spans // 6)]
    body = json.dumps(to_json([s for t in traces for s in t])).encode()
    assert len(body) > 64 * 1024  # past the size that is decoded in place
    return body


def test_the_loop_answers_while_a_big_json_export_is_decoded(
    live: LiveCollector, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()
    decode = otlp.decode_json_partial

    def held_decode(doc: Any) -> Any:
        entered.set()  # the decode stays here until /readyz has answered
        release.wait(120)
        return decode(doc)

    monkeypatch.setattr(otlp, "decode_json_partial", held_decode)
    from tokentrace.collector import http_receiver

    # where the decoder is looked up by its own name (before the decode went off the loop)
    monkeypatch.setattr(http_receiver, "decode_json_partial", held_decode, raising=False)
    result: dict[str, int] = {}
    body = _big_json_export()

    def post() -> None:
        r = httpx.post(f"{live.http}/v1/traces", content=body, headers=JSON, timeout=120)
        result["status"] = r.status_code

    exporting = threading.Thread(target=post)
    exporting.start()
    try:
        assert entered.wait(60)
        # the loop is free: /readyz answers while the decode is held (a loop blocked by the
        # decode would answer only after `release`, which comes after this timeout: no
        # answer within 3 s on a loaded machine is no sign of a blocked loop)
        r = httpx.get(f"{live.http}/readyz", timeout=60)
        assert r.status_code == 200
    finally:
        release.set()
        exporting.join(120)
    assert result == {"status": 200}


@pytest.mark.slow
def test_a_big_json_export_goes_to_the_decode_worker(tmp_path: Path) -> None:
    live, stop = start_live(tmp_path, offload=True)
    assert live.decoder is not None
    try:
        r = httpx.post(
            f"{live.http}/v1/traces", content=_big_json_export(), headers=JSON, timeout=60
        )
        assert r.status_code == 200
        assert live.decoder.offloaded == 1  # decoded by the worker process, as protobuf is
        bad = b'{"resourceSpans": 7' + b" " * 70_000
        r = httpx.post(f"{live.http}/v1/traces", content=bad, headers=JSON, timeout=60)
        assert r.status_code == 400 and "invalid JSON" in r.json()["message"]
        assert len(live.rows("SELECT trace_id FROM requests")) == 400 // 6
    finally:
        stop()
