"""What the real serving stacks emit, beyond the factories' usual shape (docs/design.md §3).

Each test cites the upstream code it mirrors, so the next engineer can re-check it.
"""

from __future__ import annotations

import pytest

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import STATUS_ERROR

from . import spanfactory as f


def test_vllm_v0_span_without_prefill_and_decode_attributes() -> None:
    """vLLM's V0 engine (vllm/engine/llm_engine.py `create_trace_span`) sets time_in_queue,
    time_to_first_token and e2e (plus time_in_scheduler / time_in_model_forward /
    time_in_model_execute), never time_in_model_prefill / _decode / _inference: the
    phases come from TTFT (prefill = TTFT − queue, decode = e2e − TTFT)."""
    spans, truth = f.vllm_trace(120.0, 340.0, 900.0, tokens=31, v0=True)
    a = spans[0].attributes
    assert not any(k.startswith("gen_ai.latency.time_in_model_") for k in a)
    a["gen_ai.latency.time_in_scheduler"] = 0.004
    a["gen_ai.latency.time_in_model_forward"] = 1.1  # V0 converts its ms to s
    (r,) = summarize_trace(spans).requests
    assert r.source == "vllm"
    assert r.prefill_ms == pytest.approx(truth.prefill)
    assert r.decode_ms == pytest.approx(truth.decode)
    assert r.queue_ms == pytest.approx(truth.queue)
    assert r.queue_wait_ms == pytest.approx(120.0)
    assert r.tpot_ms == pytest.approx(30.0)
    assert r.model == "llama" and s.FLAG_MODEL_UNNAMED not in r.flags  # V0 sent the model
    # V1 (vllm/v1/engine/output_processor.py `do_tracing`) sends prefill = first_token_ts −
    # scheduled_ts and decode = last_token_ts − first_token_ts: read as sent, even when
    # TTFT (from arrival, frontend included) would say otherwise
    v1, _ = f.vllm_trace(100.0, 200.0, 700.0)
    v1[0].attributes["gen_ai.latency.time_to_first_token"] = 0.5
    (r1,) = summarize_trace(v1).requests
    assert (r1.prefill_ms, r1.decode_ms) == (pytest.approx(200.0), pytest.approx(700.0))


@pytest.mark.parametrize(
    ("resource", "model"),
    [(f.VLLM_RESOURCE, "unknown_service:python3"),
     ({**f.VLLM_RESOURCE, "service.name": "vllm-prod"}, "vllm-prod"),
     ({"service.name": "unknown_service"}, "unknown_service")],
    ids=["newest", "otel_service_name", "older"],
)
def test_vllm_v1_names_no_model_and_the_summary_says_so(resource: dict[str, str], model: str) -> None:
    """V1's `do_tracing` sets no gen_ai.response.model nor gen_ai.request.model (only V0's
    `create_trace_span` did), and its resource names none (vllm/tracing/otel.py
    `init_tracer`, vllm/foundation/observability/tracing/otel.py in the newest releases:
    `Resource.create` of the instrumenting module and the pid, no service.name, so the
    SDK's default `unknown_service:<python executable>`, or OTEL_SERVICE_NAME's; a bare
    `TracerProvider()` before): the model column holds the service name, flagged
    `model_unnamed`."""
    spans, _ = f.vllm_trace(10.0, 50.0, 200.0, resource=dict(resource))
    (r,) = summarize_trace(spans).requests
    assert r.model == model and s.FLAG_MODEL_UNNAMED in r.flags
    # OTEL_RESOURCE_ATTRIBUTES=gen_ai.request.model=… survives vLLM's Resource.create (its
    # own keys win over the environment's, but it sets neither this one nor service.name)
    spans[0].resource = {**spans[0].resource, "gen_ai.request.model": "meta-llama/Llama-3-8B"}
    (r,) = summarize_trace(spans).requests
    assert r.model == "meta-llama/Llama-3-8B" and s.FLAG_MODEL_UNNAMED not in r.flags


def _old_sglang(tokenize: float, wait: float, prefill: float, itl: float, tokens: int) -> list:
    """SGLang as its python/sglang/srt/tracing/trace.py era emits it: root `Req <rid8>`
    (no leading space) with `rid` / `bootstrap_room` attributes, thread spans
    `Scheduler [TP 0] (host:… | pid:…)`, and contiguous slices (`auto_next_anon`)
    `request_process`, `prefill_waiting`, `prefill_forward`, then one `decode_loop` per
    decode step (`trace_slice_batch(RequestStage.DECODE_LOOP, …)`), with no
    `decode_forward` around them."""
    tid = f.new_id(16)
    decode = itl * (tokens - 1)
    e2e = tokenize + 1.0 + wait + prefill + decode + 1.0
    rid = "9f8e7d6c5b4a39281706f5e4d3c2b1a0"
    root = f.span(tid, f"Req {rid[:8]}", 0, e2e, attrs={"rid": rid, "bootstrap_room": "None"},
                  resource={"service.name": "sglang"})
    tok = f.span(tid, "Tokenizer (host:0a1b2c3d | pid:7)", 0, tokenize, root)
    sched = f.span(tid, "Scheduler [TP 0] (host:0a1b2c3d | pid:8)", tokenize, e2e - tokenize - 1.0, root)
    spans = [root, tok, sched, f.span(tid, "tokenize", 0, tokenize, tok)]
    t = tokenize
    for name, dur in (("request_process", 1.0), ("prefill_waiting", wait), ("prefill_forward", prefill)):
        spans.append(f.span(tid, name, t, dur, sched))
        t += dur
    for _ in range(tokens - 1):
        spans.append(f.span(tid, "decode_loop", t, itl, sched))
        t += itl
    return spans


def test_sglang_old_decode_loop_slices_without_decode_forward() -> None:
    spans = _old_sglang(3.0, 250.0, 60.0, 20.0, 16)
    (r,) = summarize_trace(spans).requests
    assert r.source == "sglang"
    assert r.decode_ms == pytest.approx(300.0)  # 15 decode_loop steps of 20 ms
    assert r.prefill_ms == pytest.approx(60.0)
    assert r.queue_wait_ms == pytest.approx(250.0)
    assert s.FLAG_NO_TOKEN_TIMES not in r.flags


def test_sglang_request_id_is_the_whole_rid_attribute() -> None:
    """The root's `rid` attribute holds the whole rid; the name only its first 8 characters
    (python/sglang/srt/observability/trace.py `trace_req_start`)."""
    spans = _old_sglang(3.0, 10.0, 60.0, 20.0, 4)
    (r,) = summarize_trace(spans).requests
    assert r.request_id == "9f8e7d6c5b4a39281706f5e4d3c2b1a0"


#: Slices of each disaggregated role (python/sglang/srt/observability/req_time_stats.py
#: `RequestStage`), in ms from the request's arrival.  The mini load balancer posts the
#: request to both servers at once (python/sglang/srt/disaggregation/mini_lb.py,
#: `asyncio.gather`): both roots start together; the decode server waits for the KV
#: cache (`decode_transferred`), then for a batch (`decode_waiting`, its wait queue).
PD_SLICES = {
    "prefill": [("prefill_bootstrap", 0, 10), ("prefill_waiting", 10, 30),
                ("prefill_forward", 30, 80), ("prefill_transfer_kv_cache", 80, 98)],
    "decode": [("decode_prepare", 0, 5), ("decode_bootstrap", 5, 10),
               ("decode_transferred", 10, 98), ("decode_waiting", 98, 100),
               ("decode_forward", 100, 399)],
    "": [("request_process", 0, 1), ("prefill_waiting", 1, 30), ("prefill_forward", 30, 80),
         ("decode_waiting", 80, 81), ("decode_forward", 81, 99)],
}
PD_ENDS = {"prefill": 100.0, "decode": 400.0, "": 100.0}


def _pd_root(tid: str, role: str, rid: str, room: object, parent: object = None, *,
             host: str = "0a1b2c3d4e5f6071", skew: float = 0.0) -> list:
    """A disaggregated root as its server makes it (`skew`: its clock's offset, ms)."""
    root = f.span(tid, f"{role} Req {rid[:8]}", skew, PD_ENDS[role], parent=parent,  # type: ignore[arg-type]
                  attrs={"rid": rid, "module": "sglang::request",
                         **({} if room is None else {"bootstrap_room": room})},
                  resource={"service.name": f"sglang-{role or 'unified'}"})
    sched = f.span(tid, f"Scheduler [TP 0] (host:{host[:8]} | pid:9)", skew, PD_ENDS[role], root,
                   attrs={"tp_rank": 0, "host_id": host, "pid": 9, "thread_label": "Scheduler"})
    return [root, sched, *(f.span(tid, name, skew + a, b - a, sched) for name, a, b in PD_SLICES[role])]


def test_sglang_disaggregated_roots_with_different_rids_share_the_bootstrap_room() -> None:
    """Prefill and decode servers each make their own rid when the client sent none; the
    bootstrap room (`"0x…"` on the root, python/sglang/srt/observability/trace.py
    `trace_req_start`) is what ties them."""
    tid = f.new_id(16)
    spans = (_pd_root(tid, "prefill", "aaaaaaaa1111", "0x1f2e3d")
             + _pd_root(tid, "decode", "bbbbbbbb2222", "0x1f2e3d"))
    (r,) = summarize_trace(spans).requests
    assert r.source == "sglang"
    assert r.prefill_ms == pytest.approx(50.0) and r.decode_ms == pytest.approx(299.0)
    # room 0 (`"0x0"`) or `"None"`: not disaggregated, each root is its own request
    apart = (_pd_root(tid, "", "cccccccc3333", "0x0") + _pd_root(tid, "", "dddddddd4444", "None"))
    assert len(summarize_trace(apart).requests) == 2


def test_sglang_disaggregated_roots_overlap_and_their_time_is_not_added() -> None:
    """The prefill root (100 ms) lies inside the decode root (400 ms): the server's time is
    400 ms, not their sum (500 ms, with 100 ms of it counted twice as queue).  The decode
    server's `decode_waiting` is its wait queue: queue_wait = 20 + 2 ms."""
    tid = f.new_id(16)
    spans = (_pd_root(tid, "prefill", "aaaaaaaa1111", "0x1f2e3d")
             + _pd_root(tid, "decode", "bbbbbbbb2222", "0x1f2e3d"))
    (r,) = summarize_trace(spans).requests
    assert r.e2e_ms == pytest.approx(400.0)
    assert r.queue_wait_ms == pytest.approx(22.0)
    assert r.queue_ms == pytest.approx(400.0 - 50.0 - 299.0)
    # the union of the two on one machine's clock: a prefill root that began first counts
    spans[0].start_ns -= 5 * f.MS
    (r,) = summarize_trace(spans).requests
    assert r.e2e_ms == pytest.approx(405.0)


def test_sglang_disaggregated_roots_on_two_machines_take_the_longest() -> None:
    """On two machines the clocks differ by their skew (here the decode server's runs 30 ms
    ahead): where one root lies in the other's time is unknown, and a union would count
    the skew.  The longest root, the decode server's, stands for the request."""
    tid = f.new_id(16)
    spans = (_pd_root(tid, "prefill", "aaaaaaaa1111", "0x1f2e3d", host="0a1b2c3d4e5f6071")
             + _pd_root(tid, "decode", "bbbbbbbb2222", "0x1f2e3d", host="99887766aabbccdd", skew=30.0))
    (r,) = summarize_trace(spans).requests
    assert r.e2e_ms == pytest.approx(400.0)
    # a machine known by the thread span's name only, and one not known at all
    for x in spans:
        x.attributes.pop("host_id", None)
    (r,) = summarize_trace(spans).requests
    assert r.e2e_ms == pytest.approx(400.0)
    spans[1].name = "Scheduler [TP 0]"
    (r,) = summarize_trace(spans).requests
    assert r.e2e_ms == pytest.approx(400.0)


def test_sglang_bootstrap_room_on_the_parent_span_only() -> None:
    """Releases that put a `Bootstrap Room 0x…` span above the roots (its attribute
    `bootstrap_room`; the roots carry only `rid`) tie the roots through it."""
    tid = f.new_id(16)
    room = f.span(tid, "Bootstrap Room 0x1f2e3d", 0, 500.0, attrs={"bootstrap_room": "0x1f2e3d"},
                  resource={"service.name": "sglang-router"})
    spans = ([room] + _pd_root(tid, "prefill", "aaaaaaaa1111", None, room)
             + _pd_root(tid, "decode", "bbbbbbbb2222", None, room))
    assert len(summarize_trace(spans).requests) == 1


def test_sglang_unified_decode_waiting_is_decode_time() -> None:
    """Unified, `decode_waiting` runs from the first token (prefill finished) to the first
    decode batch (req_time_stats.py `set_last_scheduled_time`, DisaggregationMode.NULL):
    decode is first token → last token, so it is decode, not queue (the review's
    5d0c7a1e…: decode 450 and queue_wait 280 for a truth of 530 and 200)."""
    spans, truth = f.sglang_trace(3.0, 200.0, 120.0, 530.0, decode_wait=80.0)
    (r,) = summarize_trace(spans).requests
    assert r.decode_ms == pytest.approx(530.0) and truth.decode == 530.0
    assert r.queue_wait_ms == pytest.approx(200.0)
    assert r.tpot_ms == pytest.approx(530.0 / 15)


@pytest.mark.parametrize(("tokens", "failed", "ttft"), [(0, False, None), (None, True, None),
                                                        (16, True, 396.0), (None, False, 396.0)])
def test_sglang_ttft_from_the_end_of_prefill_only_for_a_request_that_made_a_token(
    tokens: int | None, failed: bool, ttft: float | None
) -> None:
    """Without its TTFT attribute the end of `prefill_forward` stands in for the first
    token, as for the SDK's spans: never for a request that made none (0 output tokens,
    or failed without saying how many)."""
    spans, _ = f.sglang_trace(4.0, 250.0, 140.0, 300.0, other=4.0)  # prefill ends at 396 ms
    a = spans[0].attributes
    del a["gen_ai.latency.time_to_first_token"]
    if tokens is None:
        del a["gen_ai.usage.completion_tokens"]
    else:
        a["gen_ai.usage.completion_tokens"] = tokens
    if failed:
        spans[0].status_code = STATUS_ERROR
    (r,) = summarize_trace(spans).requests
    assert r.ttft_ms == (None if ttft is None else pytest.approx(ttft))


def test_tgi_speculative_steps_count_the_tokens_from_the_timing_fields() -> None:
    """With speculative decoding one `infer` step yields several tokens; TGI's
    time_per_token is inference_time / generated_tokens (router/src/server.rs
    `generate_stream_internal`), so the count comes from the fields."""
    spans, truth = f.tgi_trace(1.0, 50.0, 100.0, 20.0, 6)
    a = spans[0].attributes
    a["time_per_token"] = f.rust((truth.prefill + truth.decode) / 12)  # 2 tokens per step
    (r,) = summarize_trace(spans).requests
    assert r.output_tokens == 12
    assert r.prefill_ms == pytest.approx(100.0, abs=0.01)
