"""Each convention's spans give the buckets they were built with (within 1 ms or 1 %)."""

from __future__ import annotations

import pytest

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.conventions._common import rust_duration_ns

from . import spanfactory as f


def _close(actual: float | None, expected: float | None) -> bool:
    if expected is None:
        return actual is None
    assert actual is not None
    return abs(actual - expected) <= max(1.0, 0.01 * abs(expected))


def _check(spans: list, truth: f.Truth, source: str) -> s.RequestSummary:
    result = summarize_trace(spans)
    assert len(result.requests) == 1
    r = result.requests[0]
    assert r.source == source
    got = (r.e2e_ms, r.queue_ms, r.prefill_ms, r.decode_ms, r.network_ms)
    want = (truth.e2e, truth.queue, truth.prefill, truth.decode, truth.network)
    assert all(_close(g, w) for g, w in zip(got, want, strict=True)), (got, want)
    total = r.queue_ms + r.prefill_ms + r.decode_ms + (r.network_ms or 0.0)
    assert total == pytest.approx(r.e2e_ms, abs=1e-6)
    if truth.ttft is not None:
        assert _close(r.ttft_ms, truth.ttft)
    return r


@pytest.mark.parametrize("wire", [None, 42.0])
def test_vllm_buckets(wire: float | None) -> None:
    spans, truth = f.vllm_trace(120.0, 340.0, 900.0, tokens=31, wire=wire)
    r = _check(spans, truth, "vllm")
    assert r.queue_wait_ms == pytest.approx(120.0)
    assert r.tpot_ms == pytest.approx(30.0)
    assert r.output_tokens == 31 and r.prompt_tokens == 100
    # V1 names no model (`do_tracing` sets no gen_ai.*.model): the service name stands in, flagged
    assert r.model == "unknown_service:python3" and s.FLAG_MODEL_UNNAMED in r.flags
    assert r.instance == "pid 4242"  # vllm.process_id (str(os.getpid())); no host named
    assert s.FLAG_SOURCES_DISAGREE not in r.flags


def test_vllm_span_and_attribute_disagree_is_flagged() -> None:
    spans, _ = f.vllm_trace(10.0, 50.0, 200.0, disagree=True)
    (r,) = summarize_trace(spans).requests
    assert s.FLAG_SOURCES_DISAGREE in r.flags


@pytest.mark.parametrize("wire", [None, 80.0])
def test_sglang_queue_comes_from_prefill_waiting(wire: float | None) -> None:
    spans, truth = f.sglang_trace(4.0, 250.0, 60.0, 300.0, wire=wire)
    r = _check(spans, truth, "sglang")
    # time_in_model_prefill (310 ms) includes the wait; prefill itself is 60 ms
    assert r.queue_wait_ms == pytest.approx(250.0)
    assert r.tokenize_ms == pytest.approx(4.0)
    assert r.request_id == spans[0].attributes["rid"]  # the whole rid; the name has 8 characters


def test_sglang_attributes_only() -> None:
    spans, truth = f.sglang_trace(0.0, 250.0, 60.0, 300.0, other=0.0)
    # SGLang's time_in_model_prefill is first token − dispatch, and it sends no
    # time_in_queue: without the slices the wait cannot be told from the prefill
    (r,) = summarize_trace(spans[:1]).requests
    assert _close(r.prefill_ms, 310.0) and _close(r.queue_ms, 0.0) and _close(r.decode_ms, 300.0)
    assert s.FLAG_NO_TOKEN_TIMES in r.flags
    # a sender that adds the wait as time_in_queue has it taken out
    spans[0].attributes["gen_ai.latency.time_in_queue"] = 0.25
    (r,) = summarize_trace(spans[:1]).requests
    assert _close(r.prefill_ms, 60.0) and _close(r.queue_ms, 250.0) and _close(r.decode_ms, 300.0)


@pytest.mark.parametrize("handler", ["generate", "generate_stream", "chat_completions", "completions"])
@pytest.mark.parametrize("wire", [None, 15.0])
def test_tgi_buckets(handler: str, wire: float | None) -> None:
    spans, truth = f.tgi_trace(0.8, 400.0, 120.0, 25.0, 12, handler=handler, wire=wire)
    r = _check(spans, truth, "tgi")
    assert r.queue_wait_ms == pytest.approx(400.0, abs=0.01)
    assert r.tokenize_ms == pytest.approx(0.8, abs=0.01)
    assert r.output_tokens == 12
    assert r.itl_p50_ms == pytest.approx(25.0, abs=0.01)


def test_tgi_attributes_only() -> None:
    spans, truth = f.tgi_trace(1.0, 200.0, 100.0, 20.0, 10, attrs_only=True)
    r = _check(spans, truth, "tgi")
    assert r.output_tokens == 10


@pytest.mark.parametrize(
    ("text", "ns"),
    [("3.104512345s", 3_104_512_345), ("12.3ms", 12_300_000), ("123.456µs", 123_456),
     ("123.456us", 123_456), ("789ns", 789), ("2m", 120 * 10**9)],
)
def test_rust_durations(text: str, ns: int) -> None:
    assert rust_duration_ns(text) == ns


def test_rust_duration_rejects_garbage() -> None:
    assert rust_duration_ns("soon") is None
    assert rust_duration_ns(None) is None


@pytest.mark.parametrize("style", ["openllmetry", "openllmetry_old", "openinference", "genai"])
def test_client_only_conventions(style: str) -> None:
    spans, truth = f.genai_client_trace(450.0, 20.0, 11, style=style)
    (r,) = summarize_trace(spans).requests
    assert r.source == "genai_client"
    assert r.ttft_client_ms == pytest.approx(450.0)
    assert r.network_ms is None
    assert s.FLAG_SERVER_UNSEEN in r.flags
    assert r.output_tokens == 11
    if style.startswith("openllmetry"):
        assert _close(r.decode_ms, 200.0) and r.itl_p50_ms == pytest.approx(20.0)
    assert r.model == "gpt-x"


def test_client_with_plain_http_server_gives_network() -> None:
    spans, truth = f.genai_client_trace(450.0, 20.0, 11, server_ms=500.0)
    r = _check(spans, truth, "genai_client")
    assert _close(r.network_ms, truth.network)


def test_client_ttft_before_server_ttft_is_flagged() -> None:
    spans, _ = f.vllm_trace(100.0, 200.0, 300.0, wire=20.0)
    client = spans[1]
    client.attributes["gen_ai.response.time_to_first_chunk"] = 0.05  # 50 ms < server 300 ms
    (r,) = summarize_trace(spans).requests
    assert s.FLAG_SOURCES_DISAGREE in r.flags
    # impossible, so not kept: the user's wait falls back to network + the server's TTFT
    assert r.ttft_client_ms is None
    assert r.ttft_ms == pytest.approx(300.0, abs=1.0)


def test_tenant_traffic_env_and_model_from_any_span() -> None:
    spans, _ = f.vllm_trace(1.0, 2.0, 3.0, wire=1.0)
    spans[1].attributes["tenant.id"] = "acme"
    spans[1].attributes["tokentrace.traffic_class"] = "batch"
    spans[0].resource["deployment.environment.name"] = "production"
    (r,) = summarize_trace(spans).requests
    assert (r.tenant, r.traffic_class, r.environment) == ("acme", "batch", "production")


def test_unknown_spans_give_no_request() -> None:
    spans = [f.span(f.new_id(32), "SELECT users", 0, 5)]
    assert summarize_trace(spans).requests == []


def test_tgi_batch_trace_gives_engine_steps() -> None:
    tid = f.new_id(32)
    batch = f.span(tid, "batch", 0, 100, attrs={"batch_size": 3}, resource={"service.name": "tgi"})
    pre = f.span(tid, "prefill", 1, 30, batch, attrs={"id": 7, "size": 3})
    dec = f.span(tid, "decode", 31, 20, batch, attrs={"id": 7, "size": 2})
    result = summarize_trace([batch, pre, dec])
    assert result.requests == []
    assert [(s.batch_size, s.decode_seqs, s.duration_us) for s in result.engine_steps] == [
        (3, None, 30_000), (2, 2, 20_000)
    ]


@pytest.mark.parametrize(("prompt", "tokens"), [(-3, 31), (100, 2**40)])
def test_an_impossible_token_count_is_dropped_and_flagged(prompt: int, tokens: int) -> None:
    spans, _ = f.vllm_trace(10.0, 50.0, 200.0, tokens=tokens, prompt=prompt)
    (r,) = summarize_trace(spans).requests
    assert s.FLAG_IMPOSSIBLE_COUNT in r.flags
    want = (None, 31) if prompt < 0 else (100, None)
    assert (r.prompt_tokens, r.output_tokens) == want
    assert (r.tpot_ms is None) == (tokens != 31)  # no TPOT from a count that is not one
    assert r.e2e_ms == pytest.approx(260.0)  # the request itself is kept whole


def test_an_impossible_token_count_from_the_sdk_is_dropped_and_flagged() -> None:
    from tokentrace.instrumentation import semconv as sc

    tid = f.new_id(32)
    attrs = {sc.OUTPUT_TOKENS: 2**40, sc.PROMPT_TOKENS: 12, sc.REQUEST_ID: "r1"}
    req = f.span(tid, sc.SPAN_REQUEST, 0, 100.0, kind=f.KIND_SERVER, attrs=attrs)
    (r,) = summarize_trace([req]).requests
    assert r.source == "tokentrace"
    assert s.FLAG_IMPOSSIBLE_COUNT in r.flags
    assert (r.prompt_tokens, r.output_tokens) == (12, None)


@pytest.mark.parametrize("wire", [None, 30.0])
def test_sdk_buckets(wire: float | None) -> None:
    spans, truth = f.sdk_trace(2.0, 40.0, 90.0, 20.0, 10, wire=wire)
    r = _check(spans, truth, "tokentrace")
    assert r.queue_wait_ms == pytest.approx(40.0) and r.tokenize_ms == pytest.approx(2.0)
    assert s.FLAG_PREFILL_UNMARKED not in r.flags


@pytest.mark.parametrize("offsets", [True, False])
def test_sdk_a_wait_inside_prefill_or_decode_is_not_queue_again(offsets: bool) -> None:
    # A chunked prefill waits between its chunks; a preempted request is queued again
    # mid-decode (the SDK always sends queue spans). That time is already in prefill
    # (first prefill start -> first token) or decode (first -> last token): counted as
    # queue too, queue_wait outgrew the queue and tokenize and the rest read 0.
    from tokentrace.instrumentation import semconv as sc

    spans, truth = f.sdk_trace(2.0, 40.0, 90.0, 20.0, 10, wire=30.0, offsets=offsets)
    req = next(x for x in spans if x.name == sc.SPAN_REQUEST)
    prefill = next(x for x in spans if x.name == sc.SPAN_PREFILL)
    spans.remove(prefill)  # prefill 42..132 in two chunks, a 10 ms wait between them
    spans += [
        f.span(req.trace_id, sc.SPAN_PREFILL, 42.0, 18.0, req),
        f.span(req.trace_id, sc.SPAN_QUEUE, 60.0, 10.0, req),
        f.span(req.trace_id, sc.SPAN_PREFILL, 70.0, 62.0, req),
        # preempted at 200 ms (decode runs 132..312): queued 30 ms, prefilled again
        f.span(req.trace_id, sc.SPAN_QUEUE, 200.0, 30.0, req),
        f.span(req.trace_id, sc.SPAN_PREFILL, 230.0, 5.0, req),
    ]
    (r,) = summarize_trace(spans).requests
    # with token times, prefill runs from its first start to the first token (the wait
    # between chunks is in it); without, prefill is its spans' time outside decode
    wait, prefill = (40.0, 90.0) if offsets else (50.0, 80.0)
    assert r.queue_wait_ms == pytest.approx(wait) and r.tokenize_ms == pytest.approx(2.0)
    assert r.queue_ms == pytest.approx(wait + 2.0) and r.other_ms == pytest.approx(0.0, abs=1e-6)
    assert r.prefill_ms == pytest.approx(prefill) and r.decode_ms == pytest.approx(180.0)
    assert s.FLAG_BUCKET_EXCEEDS_E2E not in r.flags


def test_sdk_token_times_without_a_prefill_phase_are_flagged() -> None:
    # `@tt.traced_request` or `req.token()` alone: the wait before the first token is
    # all queue, prefill reads 0; the flag says prefill was not measured, not that it was 0.
    spans, _ = f.sdk_trace(2.0, 40.0, 90.0, 20.0, 10)
    from tokentrace.instrumentation import semconv as sc

    (r,) = summarize_trace([x for x in spans if x.name != sc.SPAN_PREFILL]).requests
    assert r.prefill_ms == 0.0 and r.queue_ms == pytest.approx(132.0)
    assert s.FLAG_PREFILL_UNMARKED in r.flags


@pytest.mark.parametrize(
    ("sent", "stored", "flagged"),
    [("batch", "batch", False), (" Batch ", "batch", False), ("INTERACTIVE", "interactive", False),
     ("<img src=x onerror=alert(1)>", "interactive", True), (7, "interactive", True), ("", "interactive", False)],
)
def test_the_traffic_class_is_interactive_or_batch(sent: object, stored: str, flagged: bool) -> None:
    # docs/design.md §3: the class is interactive or batch. Stored as sent, another value showed
    # as a class of its own that neither class filter could reach.
    from tokentrace.instrumentation import semconv as sc

    spans, _ = f.sdk_trace(2.0, 40.0, 90.0, 20.0, 10)
    req = next(x for x in spans if x.name == sc.SPAN_REQUEST)
    req.attributes[sc.TRAFFIC_CLASS] = sent
    (r,) = summarize_trace(spans).requests
    assert r.traffic_class == stored
    assert (s.FLAG_IMPOSSIBLE_VALUE in r.flags) is flagged
