"""What the real serving stacks emit, beyond the factories' usual shape (DESIGN.md §3).

Each test cites the upstream code it mirrors, so the next engineer can re-check it.
"""

from __future__ import annotations

import pytest

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.attribution import summarize_trace

from . import spanfactory as f


def test_vllm_v0_span_without_prefill_and_decode_attributes() -> None:
    """vLLM's V0 engine (vllm/engine/llm_engine.py `create_trace_span`) sets time_in_queue,
    time_to_first_token and e2e (plus time_in_scheduler / time_in_model_forward /
    time_in_model_execute), never time_in_model_prefill / _decode / _inference: the
    phases come from TTFT (prefill = TTFT − queue, decode = e2e − TTFT)."""
    spans, truth = f.vllm_trace(120.0, 340.0, 900.0, tokens=31)
    a = spans[0].attributes
    for key in ("prefill", "decode", "inference"):
        del a[f"gen_ai.latency.time_in_model_{key}"]
    a["gen_ai.latency.time_in_scheduler"] = 0.004
    a["gen_ai.latency.time_in_model_forward"] = 1.1  # V0 converts its ms to s
    (r,) = summarize_trace(spans).requests
    assert r.source == "vllm"
    assert r.prefill_ms == pytest.approx(truth.prefill)
    assert r.decode_ms == pytest.approx(truth.decode)
    assert r.queue_ms == pytest.approx(truth.queue)
    assert r.queue_wait_ms == pytest.approx(120.0)
    assert r.tpot_ms == pytest.approx(30.0)
    # V1 (vllm/v1/engine/output_processor.py `do_tracing`) sends prefill = first_token_ts −
    # scheduled_ts and decode = last_token_ts − first_token_ts: read as sent, even when
    # TTFT (from arrival, frontend included) would say otherwise
    v1, _ = f.vllm_trace(100.0, 200.0, 700.0)
    v1[0].attributes["gen_ai.latency.time_to_first_token"] = 0.5
    (r1,) = summarize_trace(v1).requests
    assert (r1.prefill_ms, r1.decode_ms) == (pytest.approx(200.0), pytest.approx(700.0))


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


def _pd_root(tid: str, role: str, rid: str, start: float, dur: float, room: object,
             parent: object = None) -> list:
    root = f.span(tid, f"{role} Req {rid[:8]}", start, dur, parent=parent,  # type: ignore[arg-type]
                  attrs={"rid": rid, **({} if room is None else {"bootstrap_room": room})},
                  resource={"service.name": f"sglang-{role}"})
    sched = f.span(tid, "Scheduler [TP 0] (host:0a1b2c3d | pid:9)", start, dur, root)
    half = dur / 2
    name = "prefill_forward" if role == "prefill" else "decode_forward"
    return [root, sched, f.span(tid, "prefill_waiting" if role == "prefill" else "decode_waiting",
                                start, half, sched),
            f.span(tid, name, start + half, half, sched)]


def test_sglang_disaggregated_roots_with_different_rids_share_the_bootstrap_room() -> None:
    """Prefill and decode servers each make their own rid when the client sent none; the
    bootstrap room (`"0x…"` on the root, python/sglang/srt/observability/trace.py
    `trace_req_start`) is what ties them."""
    tid = f.new_id(16)
    spans = (_pd_root(tid, "prefill", "aaaaaaaa1111", 0, 100.0, "0x1f2e3d")
             + _pd_root(tid, "decode", "bbbbbbbb2222", 90.0, 400.0, "0x1f2e3d"))
    (r,) = summarize_trace(spans).requests
    assert r.source == "sglang"
    assert r.prefill_ms == pytest.approx(50.0) and r.decode_ms == pytest.approx(200.0)
    assert r.e2e_ms == pytest.approx(500.0)
    # room 0 (`"0x0"`) or `"None"`: not disaggregated, each root is its own request
    apart = (_pd_root(tid, "", "cccccccc3333", 0, 100.0, "0x0")
             + _pd_root(tid, "", "dddddddd4444", 0, 100.0, "None"))
    assert len(summarize_trace(apart).requests) == 2


def test_sglang_bootstrap_room_on_the_parent_span_only() -> None:
    """Releases that put a `Bootstrap Room 0x…` span above the roots (its attribute
    `bootstrap_room`; the roots carry only `rid`) tie the roots through it."""
    tid = f.new_id(16)
    room = f.span(tid, "Bootstrap Room 0x1f2e3d", 0, 500.0, attrs={"bootstrap_room": "0x1f2e3d"},
                  resource={"service.name": "sglang-router"})
    spans = ([room] + _pd_root(tid, "prefill", "aaaaaaaa1111", 0, 100.0, None, room)
             + _pd_root(tid, "decode", "bbbbbbbb2222", 90.0, 400.0, None, room))
    assert len(summarize_trace(spans).requests) == 1


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
