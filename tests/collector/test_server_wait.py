"""A user's LLM client span comes seconds before the engine's spans (two processes, two export
schedules: tokentrace's SDK every 0.5 s, vLLM's every 5 s): the trace waits for its server side."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "analyzer"))

from spanfactory import vllm_trace  # noqa: E402

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
    from traces import to_protobuf

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
