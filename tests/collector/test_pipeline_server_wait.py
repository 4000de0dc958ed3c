"""A user's LLM client span comes seconds before the engine's spans (two processes, two export
schedules: tokentrace's SDK every 0.5 s, vLLM's every 5 s): the trace waits for its server side.
And the reverse: a client on OpenTelemetry's default schedule sends its span seconds after the
server's: a trace whose SERVER span names a parent that has not come waits for it."""

from __future__ import annotations

import dataclasses

from analyzer.spanfactory import vllm_trace  # noqa: E402

from tokentrace.analyzer.spans import KIND_CLIENT, KIND_SERVER  # noqa: E402
from tokentrace.collector.settings import CollectorSettings, SettingError  # noqa: E402

ROW = "SELECT source, network_ms, queue_ms, flags FROM requests"


def _client_and_server():  # type: ignore[no-untyped-def]
    spans, truth = vllm_trace(300, 150, 900, wire=40)
    server = next(s for s in spans if s.kind == KIND_SERVER)
    client = next(s for s in spans if s.kind == KIND_CLIENT)
    return client, server, truth


def test_the_engines_spans_three_seconds_later_still_count(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(grace_s=1.0, server_wait_s=7.0)
    client, server, truth = _client_and_server()
    assert rig.pipeline.offer([client]) is None
    rig.clock.advance(3.0)
    assert rig.pipeline.decide_ready() == 0  # past grace: still waiting for the server side
    assert rig.pipeline.offer([server]) is None
    rig.clock.advance(0.5)
    assert rig.pipeline.decide_ready() == 0  # the server's spans get their grace too
    rig.clock.advance(0.6)
    assert rig.pipeline.decide_ready() == 1  # decided grace after they came, not at server_wait
    [(source, network, queue, flags)] = rig.rows(ROW)
    assert source == "vllm"
    assert abs(network - truth.network) < 1e-6 and abs(queue - truth.queue) < 1e-6
    assert "server_unseen" not in flags


def test_a_client_whose_server_never_reports_waits_server_wait(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(grace_s=1.0, server_wait_s=7.0)
    client, _, _ = _client_and_server()
    rig.pipeline.offer([client])
    rig.clock.advance(6.9)
    assert rig.pipeline.decide_ready() == 0
    rig.clock.advance(0.2)
    assert rig.pipeline.decide_ready() == 1
    [(source, network, _, flags)] = rig.rows(ROW)
    assert source == "genai_client" and network is None and "server_unseen" in flags


def test_client_and_server_together_are_decided_at_grace(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(grace_s=1.0, server_wait_s=7.0)
    client, server, _ = _client_and_server()
    rig.pipeline.offer([server])
    rig.pipeline.offer([client])
    rig.clock.advance(1.1)
    assert rig.pipeline.decide_ready() == 1
    assert rig.rows("SELECT source FROM requests") == [("vllm",)]


def test_a_server_trace_without_client_is_not_held(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(grace_s=1.0, server_wait_s=7.0)
    spans, _ = vllm_trace(300, 150, 900)
    rig.pipeline.offer(spans)
    rig.clock.advance(1.1)
    assert rig.pipeline.decide_ready() == 1


def test_server_wait_is_a_setting_that_refuses_negatives() -> None:
    assert CollectorSettings().server_wait_s == 7.0
    try:
        CollectorSettings(server_wait_s=-1)
    except SettingError as exc:
        assert "server_wait_s" in str(exc)
    else:
        raise AssertionError("a negative server_wait_s was taken")


def test_a_client_span_packed_by_a_decode_worker_waits_too(make_rig) -> None:  # type: ignore[no-untyped-def]
    from otlp_traces import to_protobuf

    from tokentrace.collector.decode_pool import decode_export, unpack

    rig = make_rig(grace_s=1.0, server_wait_s=7.0)
    client, server, truth = _client_and_server()
    wire, _, _ = decode_export(to_protobuf([client]).SerializeToString())
    packed = unpack(wire)
    assert packed[0].pre is not None  # the worker's summary, not the spans, tells
    rig.pipeline.offer(packed)
    rig.clock.advance(3.0)
    assert rig.pipeline.decide_ready() == 0
    rig.pipeline.offer([server])
    rig.clock.advance(1.1)
    assert rig.pipeline.decide_ready() == 1
    [(source, network, _, _)] = rig.rows(ROW)
    assert source == "vllm" and abs(network - truth.network) < 1e-6


# ---- the reverse: the server's spans come first, the client's span later ------------------


def test_a_client_span_five_seconds_later_still_counts(make_rig) -> None:  # type: ignore[no-untyped-def]
    """A client exporting on OpenTelemetry's default schedule (every 5 s) sends its span after
    the engine's: decided at grace, the request lost its network and the user's TTFT."""
    rig = make_rig(grace_s=1.0, client_wait_s=7.0)
    client, server, truth = _client_and_server()
    assert server.parent_span_id == client.span_id
    assert rig.pipeline.offer([server]) is None
    rig.clock.advance(5.0)
    assert rig.pipeline.decide_ready() == 0  # past grace: its parent may still come
    assert rig.pipeline.offer([client]) is None
    rig.clock.advance(0.5)
    assert rig.pipeline.decide_ready() == 0  # the client's span gets its grace too
    rig.clock.advance(0.6)
    assert rig.pipeline.decide_ready() == 1  # grace after it came, before client_wait
    [(source, network, queue, flags)] = rig.rows(ROW)
    assert source == "vllm" and "server_unseen" not in flags
    assert abs(network - truth.network) < 1e-6 and abs(queue - truth.queue) < 1e-6
    assert rig.pipeline.stats.late_spans_kept + rig.pipeline.stats.late_spans_dropped == 0


def test_a_parent_that_never_comes_waits_client_wait(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(grace_s=1.0, client_wait_s=7.0)
    _, server, _ = _client_and_server()
    rig.pipeline.offer([server])
    rig.clock.advance(6.9)
    assert rig.pipeline.decide_ready() == 0
    rig.clock.advance(0.2)
    assert rig.pipeline.decide_ready() == 1
    [(source, network, _, _)] = rig.rows(ROW)
    assert source == "vllm" and network is None  # decided without it


def test_client_wait_zero_decides_at_grace(make_rig) -> None:  # type: ignore[no-untyped-def]
    rig = make_rig(grace_s=1.0)  # the Pipeline's own default: no wait
    _, server, _ = _client_and_server()
    rig.pipeline.offer([server])
    rig.clock.advance(1.1)
    assert rig.pipeline.decide_ready() == 1


def test_several_server_roots_under_one_missing_parent_wait_once(make_rig) -> None:  # type: ignore[no-untyped-def]
    """An agent's client span over two engine calls: both SERVER spans name it; the trace
    waits from the first one's arrival and is decided once."""
    rig = make_rig(grace_s=1.0, client_wait_s=7.0)
    client, server, _ = _client_and_server()
    (other,) = vllm_trace(200, 100, 500)[0]  # another engine call: its SERVER span alone
    second = [dataclasses.replace(other, trace_id=client.trace_id, parent_span_id=client.span_id)]
    rig.pipeline.offer([server])
    rig.clock.advance(2.0)
    rig.pipeline.offer(second)
    rig.clock.advance(5.1)  # 7.1 s after the first SERVER span
    assert rig.pipeline.decide_ready() == 1
    assert len(rig.rows("SELECT * FROM requests")) == 2
    rig.clock.advance(10)
    assert rig.pipeline.decide_ready() == 0


def test_client_wait_is_a_setting_that_refuses_negatives() -> None:
    assert CollectorSettings().client_wait_s == 7.0
    try:
        CollectorSettings(client_wait_s=-1)
    except SettingError as exc:
        assert "client_wait_s" in str(exc)
    else:
        raise AssertionError("a negative client_wait_s was taken")
