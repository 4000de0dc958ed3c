"""Odd-but-real input that once made a request vanish or a summary unsound, one case each.

Found by `test_conventions_fuzz.py`; each case here fails on the analyzer before the
tolerant reader (`analyzer/conventions/_values.py`).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.conventions._common import rust_duration_ns
from tokentrace.analyzer.spans import KIND_INTERNAL, Span, SpanEvent
from tokentrace.analyzer.trace_view import TraceView
from tokentrace.instrumentation import semconv as sc

from . import spanfactory as f
from .test_conventions_fuzz import assert_sound


def _one(spans: list[Span], source: str) -> s.RequestSummary:
    (r,) = summarize_trace(spans).requests
    assert r.source == source
    assert_sound(r)
    return r


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "nan", "-inf", "1e400", 1e300])
@pytest.mark.parametrize("key", ["gen_ai.latency.time_in_queue", "gen_ai.latency.e2e",
                                 "gen_ai.latency.time_to_first_token"])
def test_vllm_non_finite_seconds_are_flagged_not_lost(key: str, value: Any) -> None:
    spans, _ = f.vllm_trace(10.0, 50.0, 200.0)
    spans[0].attributes[key] = value
    r = _one(spans, "vllm")
    assert s.FLAG_IMPOSSIBLE_VALUE in r.flags
    assert r.e2e_ms == pytest.approx(260.0)  # the span's duration stands in for a lost e2e


@pytest.mark.parametrize("value", [float("inf"), "inf", 2**1100])
def test_vllm_non_finite_token_count_is_dropped_and_flagged(value: Any) -> None:
    spans, _ = f.vllm_trace(10.0, 50.0, 200.0, tokens=31)
    spans[0].attributes["gen_ai.usage.completion_tokens"] = value
    r = _one(spans, "vllm")
    assert r.output_tokens is None and s.FLAG_IMPOSSIBLE_COUNT in r.flags


def test_vllm_attributes_as_strings_read_as_numbers() -> None:
    spans, _ = f.vllm_trace(10.0, 50.0, 200.0, tokens=31)
    a = spans[0].attributes
    for key, v in list(a.items()):
        a[key] = f" {v} " if isinstance(v, float) else str(v)
    r = _one(spans, "vllm")
    assert (r.queue_ms, r.prefill_ms, r.decode_ms) == pytest.approx((10.0, 50.0, 200.0))
    assert r.output_tokens == 31 and r.ttft_ms == pytest.approx(60.0)


def test_vllm_span_without_e2e_is_still_a_request() -> None:
    spans, _ = f.vllm_trace(10.0, 50.0, 200.0, wire=20.0)
    del spans[0].attributes["gen_ai.latency.e2e"]
    r = _one(spans, "vllm")  # not lost, nor left to the client-only adapter
    assert r.server_ms == pytest.approx(260.0) and r.network_ms == pytest.approx(20.0)


def test_negative_ttft_is_dropped_and_flagged() -> None:
    spans, _ = f.vllm_trace(10.0, 50.0, 200.0)
    spans[0].attributes["gen_ai.latency.time_to_first_token"] = -0.06
    r = _one(spans, "vllm")
    assert r.ttft_ms is None and s.FLAG_IMPOSSIBLE_VALUE in r.flags


@pytest.mark.parametrize(
    ("text", "ns"),
    [("2m3s", 123 * 10**9), ("1h2m3.5s", 3723_500_000_000), ("1m 0.5s", 60_500_000_000), ("5", 5 * 10**9)],
)
def test_rust_durations_in_other_forms(text: str, ns: int) -> None:
    assert rust_duration_ns(text) == ns


@pytest.mark.parametrize("text", ["1e400s", float("inf"), float("nan"), "99999999999999999999h", 1e300])
def test_rust_duration_that_cannot_be_one_is_none(text: object) -> None:
    assert rust_duration_ns(text) is None


@pytest.mark.parametrize("value", ["1e400s", float("inf"), float("nan"), "99999999999999999999h"])
def test_tgi_impossible_durations_keep_the_request(value: object) -> None:
    spans, _ = f.tgi_trace(1.0, 200.0, 100.0, 20.0, 10, attrs_only=True)
    for key in ("inference_time", "time_per_token"):
        spans[0].attributes[key] = value
    r = _one(spans, "tgi")
    assert s.FLAG_IMPOSSIBLE_VALUE in r.flags


def test_tgi_handler_without_timing_fields_is_found_by_its_steps() -> None:
    spans, _ = f.tgi_trace(1.0, 200.0, 100.0, 20.0, 10)
    for key in ("total_time", "queue_time", "inference_time"):
        del spans[0].attributes[key]
    r = _one(spans, "tgi")
    assert r.output_tokens == 10 and r.prefill_ms == pytest.approx(100.0)


def test_tgi_steps_out_of_order_give_no_negative_gaps() -> None:
    spans, _ = f.tgi_trace(1.0, 20.0, 100.0, 20.0, 6)
    infer = [x for x in spans if x.name == "infer"]
    infer[2].end_ns = infer[2].start_ns - 5 * f.MS  # ends before it starts, before its neighbour
    r = _one(spans, "tgi")
    assert r.itl_p50_ms is not None and min(r.itl_gaps_ms) >= 0
    assert s.FLAG_IMPOSSIBLE_VALUE in r.flags


@pytest.mark.parametrize("name", ["Req {rid}", "  Req {rid}", " Req  {rid}", "\tReq {rid}",
                                  "prefill  Req {rid}", " Req ü{rid}", " Req <b>{rid}</b>", " Req ", "Req\u00a0{rid}"])
def test_sglang_root_names_as_senders_space_them(name: str) -> None:
    spans, _ = f.sglang_trace(4.0, 250.0, 60.0, 300.0)
    spans[0].name = name.format(rid=spans[0].trace_id[:8])
    r = _one(spans, "sglang")
    assert r.queue_wait_ms == pytest.approx(250.0) and r.prefill_ms == pytest.approx(60.0)


def test_sglang_root_under_its_own_child_is_still_the_root() -> None:
    spans, _ = f.sglang_trace(4.0, 250.0, 60.0, 300.0)
    spans[0].parent_span_id = spans[2].span_id  # a sender's parent ids loop
    _one(spans, "sglang")


def test_parent_loops_end_the_walk() -> None:
    spans, _ = f.sglang_trace(4.0, 250.0, 60.0, 300.0)
    spans[1].parent_span_id = spans[1].span_id  # its own parent
    spans[0].parent_span_id = spans[-1].span_id  # the root under its own descendant
    view = TraceView(spans)
    for x in spans:
        assert len(list(itertools.islice(view.descendants(x), 100))) < len(spans)
        assert len(list(itertools.islice(view.ancestors(x), 100))) < len(spans)


def _sdk(**attrs: Any) -> list[Span]:
    spans, _ = f.sdk_trace(1.0, 20.0, 100.0, 20.0, 8, wire=10.0)
    spans[0].attributes.update(attrs)
    return spans


@pytest.mark.parametrize("offsets", ['[1000, "x", null, 3000]', [5000, 1000, 3000], '[1000, -5, 2000]'])
def test_sdk_token_offsets_that_are_not_all_times(offsets: object) -> None:
    r = _one(_sdk(**{sc.TOKEN_OFFSETS_US: offsets}), "tokentrace")
    assert s.FLAG_IMPOSSIBLE_VALUE in r.flags
    assert min(r.itl_gaps_ms) >= 0 and r.ttft_ms == pytest.approx(1.0)


@pytest.mark.parametrize("value", ["abc", [1.0], float("nan"), "1,5"])
def test_sdk_gpu_summary_that_is_no_number(value: object) -> None:
    r = _one(_sdk(**{sc.GPU_UTIL_MEAN: value, sc.GPU_MEM_MAX_BYTES: value}), "tokentrace")
    assert (r.gpu_util_mean, r.gpu_mem_max_bytes) == (None, None)


@pytest.mark.parametrize("value", ["abc", None, [0.1], "1e400"])
def test_sdk_client_ttfc_that_is_no_number(value: object) -> None:
    spans = _sdk()
    client = spans[-1]
    client.attributes = {sc.CLIENT_TTFC_S: value}
    r = _one(spans, "tokentrace")
    assert r.ttft_client_ms is None


@pytest.mark.parametrize(("value", "cold"), [("false", False), ("0", False), ("true", True), (True, True)])
def test_cold_start_mark_as_text(value: object, cold: bool) -> None:
    spans, _ = f.vllm_trace(10.0, 50.0, 200.0)
    spans[0].attributes[sc.COLD_START] = value
    assert _one(spans, "vllm").cold_start is cold


def test_genai_client_span_without_operation_name() -> None:
    spans, _ = f.genai_client_trace(450.0, 20.0, 11, style="genai")  # no chunk events to find it by
    del spans[0].attributes["gen_ai.operation.name"]
    assert _one(spans, "genai_client").ttft_client_ms == pytest.approx(450.0)


def test_first_token_event_before_the_span_start() -> None:
    spans, _ = f.genai_client_trace(450.0, 20.0, 5, style="openinference")
    spans[0].events = [SpanEvent("First Token Stream Event", spans[0].start_ns - 10 * f.MS)]
    r = _one(spans, "genai_client")
    assert r.ttft_client_ms is None and s.FLAG_IMPOSSIBLE_VALUE in r.flags


def _agent(*calls: list[Span]) -> list[Span]:
    """One agent trace: a root span over several LLM calls."""
    tid = calls[0][0].trace_id
    root = f.span(tid, "agent.run", -5.0, 5_000.0, kind=KIND_INTERNAL, resource={"service.name": "agent"})
    out = [root]
    for spans in calls:
        ids = {x.span_id for x in spans}
        for x in spans:
            x.trace_id = tid
            if x.parent_span_id not in ids:
                x.parent_span_id = root.span_id
        out += spans
    return out


def test_agent_calling_a_traced_and_an_untraced_backend_keeps_both() -> None:
    served, _ = f.vllm_trace(10.0, 50.0, 200.0, wire=20.0)
    untraced, _ = f.genai_client_trace(450.0, 20.0, 11)
    found = summarize_trace(_agent(served, untraced)).requests
    assert sorted(r.source for r in found) == ["genai_client", "vllm"]
    for r in found:
        assert_sound(r)


def test_client_of_a_traced_backend_is_not_counted_twice() -> None:
    served, _ = f.vllm_trace(10.0, 50.0, 200.0, wire=20.0)
    assert [r.source for r in summarize_trace(_agent(served)).requests] == ["vllm"]
    # a lost span between the client and the server: the client may be its caller
    lost, _ = f.vllm_trace(10.0, 50.0, 200.0, wire=20.0)
    untraced, _ = f.genai_client_trace(450.0, 20.0, 11)
    trace = _agent(lost, untraced)
    lost[0].parent_span_id = "0badc0de0badc0de"
    assert [r.source for r in summarize_trace(trace).requests] == ["vllm"]


@pytest.mark.parametrize("make", ["vllm", "sdk"])
def test_a_caller_whose_spans_never_arrived_flags_root_missing(make: str) -> None:
    # the request's outermost span names a parent (its caller propagated traceparent)
    # that never reached the collector: network cannot be measured, and docs say so
    spans, _ = f.vllm_trace(10.0, 50.0, 200.0) if make == "vllm" else f.sdk_trace(1, 5, 50, 10, 8)
    whole = _one(list(spans), "vllm" if make == "vllm" else "tokentrace")
    assert s.FLAG_ROOT_MISSING not in whole.flags
    spans[0].parent_span_id = f.new_id(16)
    r = _one(spans, "vllm" if make == "vllm" else "tokentrace")
    assert s.FLAG_ROOT_MISSING in r.flags
    assert r.network_ms is None


def test_a_client_span_above_the_request_is_its_root() -> None:
    spans, _ = f.sdk_trace(1, 5, 50, 10, 8, wire=20.0)
    r = _one(spans, "tokentrace")
    assert s.FLAG_ROOT_MISSING not in r.flags
    client = next(x for x in spans if x.kind == 3)
    client.parent_span_id = f.new_id(16)  # the client's own caller (an agent) never arrived
    assert s.FLAG_ROOT_MISSING in _one(spans, "tokentrace").flags
