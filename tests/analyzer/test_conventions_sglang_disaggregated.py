"""SGLang with prefill and decode disaggregated: a `prefill Req …` and a `decode Req …`
root in one trace are one request, read as SGLang names its spans
(python/sglang/srt/observability/trace.py `trace_req_start`, `__create_thread_context`;
req_time_stats.py `RequestStage`).  The load balancer sends the request to both servers
at once with its one traceparent, so both roots hang from its caller's span."""

from __future__ import annotations

import pytest

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import KIND_CLIENT, Span

from . import spanfactory as f

#: ms from the request's arrival at both servers: the prefill server prefills and sends
#: the KV cache; the decode server waits for it, then for a batch, then decodes
SLICES = {
    "prefill": {"Tokenizer": [("tokenize", 0, 2), ("api_server_dispatch", 2, 3)],
                "Scheduler": [("request_process", 3, 4), ("prefill_bootstrap", 4, 12),
                              ("prefill_waiting", 12, 30), ("prefill_forward", 30, 90),
                              ("prefill_transfer_kv_cache", 90, 104)]},
    "decode": {"Tokenizer": [("tokenize", 0, 2), ("api_server_dispatch", 2, 3)],
               "Scheduler": [("request_process", 3, 4), ("decode_prepare", 4, 6),
                             ("decode_bootstrap", 6, 12), ("decode_transferred", 12, 104),
                             ("decode_waiting", 104, 108), ("decode_forward", 108, 408)]},
}
ENDS = {"prefill": 106.0, "decode": 410.0}
#: what each server's tokenizer manager sets on its root (`convert_to_gen_ai_span_attrs`):
#: the prefill server made one token, which goes no further than the load balancer
ATTRS = {
    "prefill": {"gen_ai.latency.time_to_first_token": 0.090, "gen_ai.latency.e2e": 0.106,
                "gen_ai.usage.prompt_tokens": 900, "gen_ai.usage.completion_tokens": 1},
    "decode": {"gen_ai.latency.time_to_first_token": 0.109, "gen_ai.latency.e2e": 0.410,
               "gen_ai.usage.prompt_tokens": 900, "gen_ai.usage.completion_tokens": 151},
}


def _root(tid: str, role: str, rid: str, parent: Span, *, room: str | None, host: str,
          skew: float = 0.0) -> list[Span]:
    attrs = {"rid": rid, "module": "sglang::request", **ATTRS[role]}
    if room is not None:
        attrs["bootstrap_room"] = room
    root = f.span(tid, f"{role} Req {rid[:8]}", skew, ENDS[role], parent, attrs=attrs,
                  resource={"service.name": f"sglang-{role}"})
    spans = [root]
    for pid, (label, slices) in enumerate(SLICES[role].items(), start=7):
        rank = " [TP 0] " if label == "Scheduler" else ""
        thread = f.span(tid, f"{label}{rank}(host:{host[:8]} | pid:{pid})", skew, ENDS[role], root,
                        attrs={"host_id": host, "pid": pid, "thread_label": label,
                               **({"tp_rank": 0} if rank else {})})
        spans.append(thread)
        spans += [f.span(tid, name, skew + a, b - a, thread) for name, a, b in slices]
    return spans


def _request(*, room: str | None, same_host: bool) -> tuple[Span, list[Span]]:
    tid = f.new_id(16)
    client = f.span(tid, "openai.chat", -6, ENDS["decode"] + 12, kind=KIND_CLIENT,
                    attrs={"gen_ai.operation.name": "chat"}, resource={"service.name": "app"})
    prefill = _root(tid, "prefill", "aaaaaaaa11112222", client, room=room, host="0a1b2c3d4e5f6071")
    decode = _root(tid, "decode", "bbbbbbbb33334444", client, room=room,
                   host="0a1b2c3d4e5f6071" if same_host else "99887766aabbccdd",
                   skew=0.0 if same_host else 25.0)
    return client, [client, *prefill, *decode]


@pytest.mark.parametrize("same_host", [True, False])
def test_one_request_whose_buckets_cover_the_user_time_once(same_host: bool) -> None:
    client, spans = _request(room="0x5f3a", same_host=same_host)
    (r,) = summarize_trace(spans).requests
    assert r.e2e_ms == pytest.approx(client.duration_ns / f.MS)
    assert r.server_ms == pytest.approx(410.0)  # the decode root holds the prefill's time
    assert r.network_ms == pytest.approx(12.0)
    assert r.network_ms + r.queue_ms + r.prefill_ms + r.decode_ms == pytest.approx(r.e2e_ms)
    assert (r.prefill_ms, r.decode_ms) == (pytest.approx(60.0), pytest.approx(300.0))
    # the prefill server's wait for a batch and the decode server's: 18 + 4
    assert r.queue_wait_ms == pytest.approx(22.0)


def test_what_the_user_got_is_the_decode_server_answer() -> None:
    _, spans = _request(room="0x5f3a", same_host=True)
    (r,) = summarize_trace(spans).requests
    # not the prefill server's one token, TTFT and rid
    assert r.output_tokens == 151 and r.prompt_tokens == 900
    assert r.ttft_ms == pytest.approx(109.0)
    assert r.request_id == "bbbbbbbb33334444"
    assert r.tpot_ms == pytest.approx(300.0 / 150)


def test_roots_without_a_room_are_tied_by_their_caller() -> None:
    # releases that set no bootstrap_room: different rids (the client sent none), one caller
    _, spans = _request(room=None, same_host=True)
    (r,) = summarize_trace(spans).requests
    assert r.server_ms == pytest.approx(410.0) and r.output_tokens == 151


def test_two_unified_requests_under_one_caller_stay_two() -> None:
    tid = f.new_id(16)
    caller = f.span(tid, "agent", 0, 900, resource={"service.name": "app"})
    a = f.span(tid, " Req aaaaaaaa", 0, 300, caller, attrs={"rid": "aaaaaaaa1"})
    b = f.span(tid, " Req bbbbbbbb", 400, 300, caller, attrs={"rid": "bbbbbbbb1"})
    assert len(summarize_trace([caller, a, b]).requests) == 2
