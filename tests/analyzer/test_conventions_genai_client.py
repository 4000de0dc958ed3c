"""The client-only (OTel GenAI) adapter: which spans are requests, and their decode.

A client-only streamed call with no per-chunk times still has a decode: from its first
chunk to the end of the client span (the span ends when the stream does).

OpenTelemetry GenAI client spans often carry only `gen_ai.response.time_to_first_chunk`
(OpenInference: one "First Token Stream Event").  Their decode used to read 0, its time
booked as queue (87 % of E in the review's traces: a false "slow before inference"
finding), and their TPOT as 0.0 ms, where docs/design.md §2 says what is not measured is
None, never zero.

The client-only adapter's requests are the outermost LLM client spans, as the walk up
(`TraceView.ancestors`) finds them, on parent ids that loop too.

Its remembered answers used to stop where a walk came back round a loop to the client
span it started from, and remember the spans on the way as having no client above: with
client span A and span B each other's parent and client span D under B, it gave A and
D, one request too many (D lies inside B, inside A).
"""

from __future__ import annotations

import random

import pytest

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.conventions import genai_client
from tokentrace.analyzer.itl import apply_tpot
from tokentrace.analyzer.spans import KIND_CLIENT, KIND_INTERNAL, Span, SpanEvent
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.analyzer.trace_view import TraceView
from tokentrace.instrumentation import semconv as sc

from . import spanfactory as f
from .spanfactory import MS, new_id, span

T0 = 1_700_000_000 * 10**9


def _call(style: str, *, ttft: float = 300.0, gap: float = 20.0, tokens: int | None = 100,
          ttfc: bool = True) -> RequestSummary:  # fmt: skip
    """One streamed call of `tokens` tokens: the first at `ttft` ms, then one each `gap` ms."""
    tid = new_id(32)
    total = ttft + gap * ((tokens or 1) - 1)
    attrs: dict[str, object]
    events = []
    if style == "genai":
        attrs = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "gpt-x",
            "gen_ai.usage.input_tokens": 50,
        }
        if tokens is not None:
            attrs["gen_ai.usage.output_tokens"] = tokens
        if ttfc:
            attrs["gen_ai.response.time_to_first_chunk"] = ttft / 1000
        kind = KIND_CLIENT
    else:
        attrs = {
            "openinference.span.kind": "LLM",
            "llm.model_name": "gpt-x",
            "llm.token_count.prompt": 50,
        }
        if tokens is not None:
            attrs["llm.token_count.completion"] = tokens
        if ttfc:
            events = [SpanEvent("First Token Stream Event", T0 + round(ttft * MS))]
        kind = KIND_INTERNAL
    c = span(
        tid,
        "chat gpt-x",
        0,
        total,
        kind=kind,
        attrs=attrs,
        resource={"service.name": "app"},
        events=events,
    )
    (r,) = summarize_trace([c]).requests
    assert r.source == "genai_client"
    return r


@pytest.mark.parametrize("style", ["genai", "openinference"])
def test_a_streamed_call_with_only_its_first_chunk_time_decodes_after_it(style: str) -> None:
    r = _call(style)  # s7 part a: 300 ms to the first chunk, then 99 tokens at 20 ms
    assert r.ttft_client_ms == pytest.approx(300.0)
    assert r.decode_ms == pytest.approx(1980.0)
    assert r.tpot_ms == pytest.approx(20.0)
    assert r.prefill_ms == pytest.approx(300.0)
    assert r.queue_ms == pytest.approx(0.0)
    assert r.network_ms is None
    assert r.queue_ms + r.prefill_ms + r.decode_ms == pytest.approx(r.e2e_ms)


def test_with_a_server_span_below_the_decode_is_still_the_clients_after_the_first_chunk() -> None:
    spans, truth = f.genai_client_trace(200.0, 25.0, 9, style="genai", server_ms=380.0)
    (r,) = summarize_trace(spans).requests
    client = spans[0]
    assert r.decode_ms == pytest.approx(client.duration_ns / MS - 200.0)
    assert r.network_ms == pytest.approx(truth.network)  # 401 − 380
    assert r.prefill_ms == pytest.approx(200.0 - truth.network)
    assert r.tpot_ms == pytest.approx(r.decode_ms / 8)
    assert r.network_ms + r.queue_ms + r.prefill_ms + r.decode_ms == pytest.approx(r.e2e_ms)


def test_one_token_has_no_decode_and_no_tpot() -> None:
    r = _call("genai", tokens=1)
    assert r.decode_ms == 0.0 and r.tpot_ms is None


def test_an_unknown_token_count_leaves_decode_unmeasured() -> None:
    r = _call("genai", tokens=None)
    assert r.decode_ms == 0.0 and r.tpot_ms is None


@pytest.mark.parametrize("style", ["genai", "openinference"])
def test_a_call_without_a_first_chunk_time_has_no_tpot_not_tpot_zero(style: str) -> None:
    """Not streamed (or not timed): nothing measured the decode, so TPOT is None."""
    r = _call(style, ttfc=False)
    assert r.decode_ms == 0.0
    assert r.tpot_ms is None


def test_apply_tpot_gives_none_when_the_decode_was_not_measured() -> None:
    summary = RequestSummary("t", "r", 0, e2e_ms=100.0, queue_ms=100.0, prefill_ms=0.0, decode_ms=0.0,
                             output_tokens=10)  # fmt: skip
    apply_tpot(summary, decode_measured=False)
    assert summary.tpot_ms is None
    apply_tpot(summary)
    assert summary.tpot_ms == 0.0  # measured: a decode of 0 over 9 gaps is a TPOT of 0


def test_server_conventions_without_a_decode_measure_give_no_tpot() -> None:
    spans, _ = f.vllm_trace(30, 120, 400)
    del spans[0].attributes["gen_ai.latency.time_in_model_decode"]
    (r,) = summarize_trace(spans).requests
    assert r.source == "vllm" and r.tpot_ms is None
    spans, _ = f.tgi_trace(2, 15, 80, 20, 11, attrs_only=True)
    del spans[0].attributes["inference_time"]
    (r,) = summarize_trace(spans).requests
    assert r.source == "tgi" and r.tpot_ms is None
    spans, _ = f.sdk_trace(2, 10, 50, 20, 10, offsets=False)
    spans = [x for x in spans if x.name != "tokentrace.decode"]
    (r,) = summarize_trace(spans).requests
    assert r.source == "tokentrace" and r.tpot_ms is None


_LLM = {"gen_ai.operation.name": "chat"}


def _walk(trace: TraceView) -> list[Span]:
    """The plain walk: a client span is a request unless a client span lies above it."""
    clients = [x for x in trace.spans if genai_client.is_llm_client(x)]
    return [
        c for c in clients if not any(genai_client.is_llm_client(a) for a in trace.ancestors(c))
    ]


def _client(span_id: str, parent: str, name: str) -> Span:
    return Span("t" * 32, span_id, parent, name, KIND_CLIENT, 0, MS, attributes=dict(_LLM))


def test_a_client_under_a_loop_through_a_client_is_no_request_of_its_own() -> None:
    a, b, d = new_id(), new_id(), new_id()
    spans = [
        _client(a, b, "A"),
        Span("t" * 32, b, a, "B", KIND_INTERNAL, 0, MS),
        _client(d, b, "D"),
    ]
    view = TraceView(spans)
    assert [x.name for x in _walk(view)] == ["A"]
    assert [x.name for x in genai_client.outer_clients(view)] == ["A"]
    [got] = summarize_trace(spans).requests
    assert got.source == genai_client.NAME


def test_outer_clients_are_the_walks_on_random_parent_links() -> None:
    """Chains, missing parents, loops of parent ids and spans leading into them,
    repeated span ids, client spans and others among them."""
    rng = random.Random(13)
    for _ in range(3000):
        n = rng.randint(1, 12)
        ids = [new_id() for _ in range(n)]
        if rng.random() < 0.2:  # a span id sent twice
            ids[rng.randrange(n)] = rng.choice(ids)
        spans = []
        for i in range(n):
            r = rng.random()
            parent = "" if r < 0.15 else (new_id() if r < 0.25 else rng.choice(ids))
            if rng.random() < 0.5:
                spans.append(_client(ids[i], parent, f"c{i}"))
            else:
                kind = KIND_CLIENT if rng.random() < 0.5 else KIND_INTERNAL
                name = sc.SPAN_CLIENT if rng.random() < 0.1 else f"x{i}"
                spans.append(Span("t" * 32, ids[i], parent, name, kind, 0, MS))
        rng.shuffle(spans)
        view = TraceView(spans)
        got = genai_client.outer_clients(view)
        assert [id(x) for x in got] == [id(x) for x in _walk(view)], [
            (x.name, x.span_id, x.parent_span_id) for x in spans
        ]
