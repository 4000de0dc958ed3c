"""Bad input at a live collector: a clear refusal, and nothing already accepted lost.

Each test sends a good request next to a bad one, so the bad one lands in the
same decision round and the same DuckDB transaction as the good one would."""

from __future__ import annotations

import gzip
import json
import math
import sys

import grpc
import httpx
import pytest
from otlp_traces import request_trace, to_json, to_protobuf

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.collector.collector import Collector
from tokentrace.collector.settings import CollectorSettings
from tokentrace.collector.writer import WriteBatch, Writer
from tokentrace.serve import CollectorServer
from tokentrace.store.connection import open_db

PB = {"Content-Type": "application/x-protobuf"}
TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"


def _root(export):  # type: ignore[no-untyped-def]
    """The request span: `request_trace` puts it last."""
    return export.resource_spans[0].scope_spans[0].spans[-1]


def _services(live) -> list[str]:  # type: ignore[no-untyped-def]
    return [r[0] for r in live.rows("SELECT service FROM requests ORDER BY service")]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("start_time_unix_nano", 2**64 - 1, "0..2^63-1"),
        ("end_time_unix_nano", 2**63, "0..2^63-1"),
        ("kind", 1000, "kind must be 0..5"),
        ("span_id", bytes(8), "must not be all zeros"),
    ],
)
def test_protobuf_values_the_store_cannot_hold_reject_the_span_not_the_round(
    live, field: str, value: object, says: str
) -> None:  # type: ignore[no-untyped-def]
    export = to_protobuf(request_trace(service="good"))
    bad = to_protobuf(request_trace(service="bad"))
    setattr(_root(bad), field, value)
    export.resource_spans.extend(bad.resource_spans)
    r = httpx.post(f"{live.http}/v1/traces", content=export.SerializeToString(), headers=PB)
    assert r.status_code == 200
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    reply = ExportTraceServiceResponse.FromString(r.content)
    assert reply.partial_success.rejected_spans == 1
    assert says in reply.partial_success.error_message
    # the good request of the same export is stored (a BIGINT/TINYINT overflow
    # used to fail the whole write, and with it every request of the round)
    assert "good" in _services(live)


@pytest.mark.slow
def test_grpc_status_code_out_of_range_is_rejected(live) -> None:  # type: ignore[no-untyped-def]
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    export = to_protobuf(request_trace(service="good"))
    bad = to_protobuf(request_trace(service="bad"))
    _root(bad).status.code = 1000  # type: ignore[assignment]
    export.resource_spans.extend(bad.resource_spans)
    with grpc.insecure_channel(live.grpc_target) as channel:
        reply = trace_service_pb2_grpc.TraceServiceStub(channel).Export(export, timeout=5)
    assert reply.partial_success.rejected_spans == 1
    assert "status code must be 0..2" in reply.partial_success.error_message
    assert _services(live) == ["good"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"startTimeUnixNano": "-5"}, "startTimeUnixNano must be in 0.."),
        ({"endTimeUnixNano": str(10**30)}, "endTimeUnixNano must be in 0.."),
        ({"startTimeUnixNano": True}, "startTimeUnixNano must be an integer"),
        ({"kind": 10**30}, "kind must be in 0..5"),
        ({"status": {"code": 2**40}}, "status.code must be in 0..2"),
        ({"traceId": "0" * 32}, "must not be all zeros"),
        ({"events": "x"}, "events must be a list, got str"),
        ({"links": [1]}, "each link must be an object, got int"),
        ({"attributes": [{"key": "a", "value": {"intValue": str(10**40)}}]}, "intValue must be in"),
        ({"attributes": [{"key": "a", "value": {"boolValue": "false"}}]}, "boolValue must be true or false"),
        ({"attributes": [{"key": "a", "value": {"kvlistValue": [1]}}]}, "kvlistValue must be an object"),
    ],
)
def test_json_wrong_values_are_named_and_the_rest_is_kept(live, change, says) -> None:  # type: ignore[no-untyped-def]
    doc = to_json(request_trace(service="good"))
    bad = to_json(request_trace(service="bad"))
    bad["resourceSpans"][0]["scopeSpans"][0]["spans"][-1].update(change)
    doc["resourceSpans"] += bad["resourceSpans"]
    r = httpx.post(f"{live.http}/v1/traces", json=doc)
    assert r.status_code == 200
    partial = r.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and says in partial["errorMessage"], partial
    assert "good" in _services(live)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"resourceSpans": [{"scopeSpans": "abc"}]}, "scopeSpans must be a list, got str"),
        ({"resourceSpans": [{"scopeSpans": [1]}]}, "each scopeSpans entry must be an object"),
        ({"resourceSpans": [{"resource": "abc"}]}, "resource must be an object, got str"),
        ({"resourceSpans": [{"scopeSpans": [{"scope": "x"}]}]}, "scope must be an object"),
    ],
)
def test_json_structure_errors_say_which_field(live, doc, says) -> None:  # type: ignore[no-untyped-def]
    r = httpx.post(f"{live.http}/v1/traces", json=doc)
    assert r.status_code == 400
    assert says in r.json()["message"]
    # a google.rpc.Status in JSON, as the protobuf body: INVALID_ARGUMENT, not the HTTP 400
    assert r.json()["code"] == 3


@pytest.mark.parametrize("service", [TRACE_SERVICE, METRICS_SERVICE])
def test_grpc_malformed_message_is_invalid_argument_with_the_reason(live, service: str) -> None:  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(live.grpc_target) as channel:
        export = channel.unary_unary(
            f"/{service}/Export", request_serializer=lambda b: b, response_deserializer=lambda b: b
        )
        with pytest.raises(grpc.RpcError) as err:
            export(b"\x0a\xff\xff\xff\x0f garbage", timeout=5)
    # not INTERNAL "Exception deserializing request!": the sender must not retry,
    # and must see what is wrong
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "invalid OTLP" in (err.value.details() or "")
    with grpc.insecure_channel(live.grpc_target) as channel:  # and the server still takes data
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        stub.Export(to_protobuf(request_trace(service="after")), timeout=5)
    assert _services(live) == ["after"]


@pytest.mark.slow
def test_gzip_with_several_members_is_read_whole(live) -> None:  # type: ignore[no-untyped-def]
    body = json.dumps(to_json(request_trace(service="members"))).encode()
    half = len(body) // 2
    r = httpx.post(
        f"{live.http}/v1/traces",
        content=gzip.compress(body[:half]) + gzip.compress(body[half:]),
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert r.status_code == 200, r.text
    assert _services(live) == ["members"]


@pytest.mark.slow
def test_gzip_with_garbage_after_it_is_refused(live) -> None:  # type: ignore[no-untyped-def]
    body = gzip.compress(json.dumps(to_json(request_trace())).encode()) + b"junk"
    r = httpx.post(
        f"{live.http}/v1/traces",
        content=body,
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert r.status_code == 400
    assert "after the gzip stream" in r.json()["message"]


def test_gzip_bomb_members_stay_bounded(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from collector_testkit import start_live

    live, stop = start_live(tmp_path, max_body_bytes=1 << 20)
    try:
        member = gzip.compress(b" " * (600 << 10))  # each under the bound, together over it
        r = httpx.post(
            f"{live.http}/v1/traces",
            content=member * 4,
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
        assert r.status_code == 413
    finally:
        stop()


def test_an_export_sent_twice_counts_one_request(live) -> None:  # type: ignore[no-untyped-def]
    # an exporter that lost the reply retries the same export
    body = to_protobuf(request_trace(service="retried")).SerializeToString()
    for _ in range(2):
        assert httpx.post(f"{live.http}/v1/traces", content=body, headers=PB).status_code == 200
    assert live.rows("SELECT count(*), max(array_length(flags)) FROM requests") == [(1, 0)]
    assert live.collector.pipeline.stats.duplicate_spans_dropped == 6


def test_writer_drops_only_the_row_duckdb_refuses(tmp_path) -> None:  # type: ignore[no-untyped-def]
    conn = open_db(tmp_path / "w.duckdb")
    writer = Writer(conn)
    try:
        good = summarize_trace(request_trace(service="good")).requests
        bad = summarize_trace(request_trace(service="bad")).requests
        bad[0].output_tokens = 2**40  # an INTEGER column: DuckDB refuses the row
        later = summarize_trace(request_trace(service="later")).requests
        assert writer.submit(WriteBatch(requests=good + bad))
        assert writer.submit(WriteBatch(requests=later))
        writer.flush()
        rows = conn.execute("SELECT service FROM requests ORDER BY service").fetchall()
        assert rows == [("good",), ("later",)]
        assert conn.execute("SELECT count(*) FROM itl_hist").fetchall() == [(2,)]
        assert writer.write_errors == 1
    finally:
        writer.close()
        conn.close()


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"grace_s": math.nan}, "grace_s must be a finite number"),
        ({"slo_ttft_ms": math.inf}, "slo_ttft_ms must be a finite number"),
        ({"http_port": 14999, "grpc_port": 14999}, "http_port and grpc_port are both 14999"),
        ({"max_body_bytes": -5}, "max_body_bytes must be positive, got -5"),
    ],
)
def test_settings_refuse_what_would_fail_later(tmp_path, overrides, says) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=says):
        CollectorSettings(db=tmp_path / "s.duckdb", **overrides)


def test_a_port_in_use_is_named_before_anything_starts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket

    from tt_testkit import free_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = CollectorSettings(
            db=tmp_path / "p.duckdb", http_port=free_port(), grpc_port=port, web_port=0
        )
        with pytest.raises(OSError, match=rf"OTLP/gRPC on 127.0.0.1:{port}: .*--grpc-port"):
            CollectorServer(settings).start()


@pytest.mark.slow
def test_a_broken_web_package_is_an_error_not_a_missing_ui(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # `None` in sys.modules makes the import fail as a broken module of ours would
    monkeypatch.setitem(sys.modules, "tokentrace.web.app", None)
    settings = CollectorSettings(db=tmp_path / "web.duckdb", http_port=0, grpc_port=0, web_port=0)
    with pytest.raises(ModuleNotFoundError):
        CollectorServer(settings).start()


def test_collector_that_cannot_start_closes_its_database(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def broken(*args: object, **kw: object) -> None:
        raise ValueError("broken pipeline")

    monkeypatch.setattr("tokentrace.collector.collector.Pipeline", broken)
    with pytest.raises(ValueError, match="broken pipeline") as failed:
        Collector(CollectorSettings(db=tmp_path / "c.duckdb"))
    del failed  # its traceback holds the half-built collector
    # closed: DuckDB refuses a second connection with another configuration
    # to a file that is still open in this process
    open_db(tmp_path / "c.duckdb", memory_limit="64MB").close()



def _steps_span(service: str, starts: list[object], kv: list[object]) -> list:  # type: ignore[type-arg]
    from otlp_traces import T0, new_id

    from tokentrace.analyzer.spans import Span
    from tokentrace.instrumentation import semconv as sc

    n = len(starts)
    attrs = {
        sc.STEP_COUNT: n,
        sc.STEP_START_NS: sc.pack_list(starts),
        sc.STEP_DURATION_US: sc.pack_list([1000] * n),
        sc.STEP_DECODE_SEQS: sc.pack_list([2] * n),
        sc.STEP_BATCH_SIZE: sc.pack_list([2] * n),
        sc.STEP_KV_USAGE: sc.pack_list(kv),
        sc.STEP_REQUEST_IDS: sc.pack_list(["a,b"] * n),
    }
    return [Span(new_id(16), new_id(8), "", sc.SPAN_ENGINE_STEPS, 1, T0, T0 + 10**6, attrs,
                 {"service.name": service})]  # fmt: skip


def test_engine_step_values_that_are_no_numbers_lose_their_field_not_the_round(
    live,
) -> None:  # type: ignore[no-untyped-def]
    # any sender may write the step lists: a string where a number belongs used to
    # make the analyzer raise, failing the decision round and every trace in it
    from otlp_traces import T0

    export = to_protobuf(request_trace(service="good"))
    steps = _steps_span("engine", [T0, "soon", T0 + 2_000_000], [0.5, "half", 0.25])
    export.resource_spans.extend(to_protobuf(steps).resource_spans)
    r = httpx.post(f"{live.http}/v1/traces", content=export.SerializeToString(), headers=PB)
    assert r.status_code == 200
    assert _services(live) == ["good"]
    rows = live.rows("SELECT start_ns, kv_usage, request_ids FROM engine_steps ORDER BY start_ns")
    # the step without a usable start is left out; a kv_usage that is no number is unknown
    assert rows == [(T0, 0.5, ["a", "b"]), (T0 + 2_000_000, 0.25, ["a", "b"])]


@pytest.mark.slow
def test_a_trace_the_analyzer_fails_on_is_kept_whole_and_costs_no_other(
    live, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    # whatever bug the analyzer still has, one trace it fails on must not take the
    # round's other traces with it, and its spans are kept to look at
    import tokentrace.collector.deciding as deciding

    def summarize(spans):  # type: ignore[no-untyped-def]
        if any(s.resource.get("service.name") == "poison" for s in spans):
            raise RuntimeError("an analyzer bug")
        return summarize_trace(spans)

    monkeypatch.setattr(deciding, "summarize_trace", summarize)
    poison = request_trace(service="poison")
    export = to_protobuf(request_trace(service="good"))
    for spans in (poison, request_trace(service="fine")):
        export.resource_spans.extend(to_protobuf(spans).resource_spans)
    r = httpx.post(f"{live.http}/v1/traces", content=export.SerializeToString(), headers=PB)
    assert r.status_code == 200
    assert _services(live) == ["fine", "good"]
    kept = live.rows("SELECT trace_id, reason FROM kept_traces WHERE reason = 'unsummarized'")
    assert kept == [(poison[0].trace_id, "unsummarized")]
    stored = live.rows("SELECT count(*) FROM spans WHERE trace_id = ?", [poison[0].trace_id])
    assert stored == [(len(poison),)]
