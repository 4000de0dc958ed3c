"""TGI requests that do not end well are still requests (docs/design.md §3).

TGI records its timing fields (`total_time`, `queue_time`, …) only when an answer ends
(router/src/server.rs `generate_stream_internal`: the `span.record` calls sit in the
`InferStreamResponse::End` arm).  A client that leaves mid-stream, a generation error,
a 429 (overloaded) or a 422 (validation) leave the handler without them, and TGI nests
its `queued` / `infer` spans below `async_stream` → `generate_stream` → `schedule`, not
under the handler: such requests used to vanish from every report (the review's
probe_tgi_nofields: 3 requests, 0 summarized).
"""

from __future__ import annotations

from typing import Any

import pytest

from tokentrace.analyzer import attribution
from tokentrace.analyzer import summary as s
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import KIND_SERVER, STATUS_ERROR, Span, SpanEvent
from tokentrace.analyzer.summary import RequestSummary

from . import spanfactory as f
from .counting_view import CountingDict as _CountingDict
from .counting_view import CountingView as _CountingView

FIELDS = ("total_time", "validation_time", "queue_time", "inference_time", "time_per_token", "seed")


def _unfinished(**kw: Any) -> tuple[list[Span], f.Truth]:
    """A TGI request as the router leaves it when the answer did not end: no fields."""
    spans, truth = f.tgi_trace(2.0, 300.0, 150.0, 30.0, 12, **kw)
    for key in FIELDS:
        spans[0].attributes.pop(key, None)
    return spans, truth


def _named(spans: list[Span], name: str) -> list[Span]:
    return [x for x in spans if x.name == name]


def _one(spans: list[Span]) -> RequestSummary:
    (r,) = summarize_trace(spans).requests
    assert r.source == "tgi"
    return r


@pytest.mark.parametrize("handler", sorted(f.TGI_ROUTES))
def test_a_client_that_left_mid_stream_is_summarized_from_the_spans(handler: str) -> None:
    spans, truth = _unfinished(handler=handler)
    r = _one(spans)
    assert (r.e2e_ms, r.queue_ms, r.prefill_ms, r.decode_ms) == pytest.approx(
        (truth.e2e, truth.queue, truth.prefill, truth.decode), abs=0.01
    )
    assert r.queue_wait_ms == pytest.approx(300.0, abs=0.01)
    assert r.tokenize_ms == pytest.approx(2.0, abs=0.01)  # the `validate` span
    assert r.ttft_ms == pytest.approx(truth.ttft, abs=0.01)
    assert r.output_tokens == 12 and r.tpot_ms == pytest.approx(30.0, abs=0.01)
    assert not r.error and s.FLAG_NO_INFERENCE not in r.flags


def test_a_generation_error_counts_as_an_error() -> None:
    # Infer logs `tracing::error!("{err}")`: tracing-opentelemetry sets the span's status
    spans, _ = _unfinished()
    (inner,) = _named(spans, "generate_stream")[1:]
    inner.status_code = STATUS_ERROR
    r = _one(spans)
    assert r.error and r.prefill_ms == pytest.approx(150.0, abs=0.01)


def test_an_error_event_counts_even_where_the_status_was_lost() -> None:
    spans, _ = _unfinished()
    (inner,) = _named(spans, "generate_stream")[1:]
    inner.events = [
        SpanEvent(
            "Request failed during generation: CUDA OOM",
            inner.end_ns,
            {"level": "ERROR", "target": "text_generation_router::infer"},
        )
    ]
    assert _one(spans).error


def _refused(handler: str, *, at_validation: bool) -> list[Span]:
    """A request TGI refused before inference: 429 (the concurrency semaphore is full,
    `Infer::generate_stream` fails at once) or 422 (`validate` fails)."""
    spans, _ = _unfinished(handler=handler)
    gone = {"queued", "infer", "schedule"} | (set() if at_validation else {"validate"})
    spans = [x for x in spans if x.name not in gone]
    failed = _named(spans, "validate")[0] if at_validation else _named(spans, "generate_stream")[-1]
    failed.status_code = STATUS_ERROR
    # the spans end when TGI answers: 0.5 ms after the handler began
    h = spans[0]
    for x in spans:
        if x.kind != KIND_SERVER:
            x.end_ns = min(x.end_ns, h.start_ns + 500_000)
    (http,) = [x for x in spans if x.kind == KIND_SERVER]
    http.end_ns = h.end_ns + 50_000
    http.attributes["http.response.status_code"] = 422 if at_validation else 429
    return spans


@pytest.mark.parametrize("handler", ["generate", "generate_stream", "chat_completions"])
@pytest.mark.parametrize("at_validation", [False, True], ids=["429", "422"])
def test_a_refused_request_has_its_server_time_only_and_says_so(
    handler: str, at_validation: bool
) -> None:
    spans = _refused(handler, at_validation=at_validation)
    r = _one(spans)
    (http,) = [x for x in spans if x.kind == KIND_SERVER]
    assert r.e2e_ms == pytest.approx(http.duration_ns / f.MS)
    assert r.error and s.FLAG_NO_INFERENCE in r.flags
    assert (r.prefill_ms, r.decode_ms, r.ttft_ms, r.tpot_ms, r.output_tokens) == (
        0.0,
        0.0,
        None,
        None,
        None,
    )
    assert r.route == f.TGI_ROUTES[handler]


def test_a_request_refused_before_infer_is_told_by_the_service_name() -> None:
    # chat_completions can fail in `try_into_generate` (its template), before Infer
    spans = [
        x
        for x in _refused("chat_completions", at_validation=False)
        if x.name not in ("async_stream", "generate_stream")
    ]
    assert len(spans) == 2
    r = _one(spans)
    assert s.FLAG_NO_INFERENCE in r.flags
    spans[0].resource = spans[1].resource = {"service.name": "router"}
    # a bare span of that name, in another service: not TGI's
    assert all(r.source != "tgi" for r in summarize_trace(spans).requests)


def test_a_client_gone_while_queued_keeps_its_queue_wait() -> None:
    spans, _ = _unfinished()
    spans = [x for x in spans if x.name != "infer"]
    r = _one(spans)
    assert r.queue_wait_ms == pytest.approx(300.0, abs=0.01) and s.FLAG_NO_INFERENCE in r.flags
    assert not r.error


def test_an_http_span_closed_with_the_headers_does_not_cut_the_request_short() -> None:
    # an instrumentation that closes the HTTP span with the response future ends it when
    # a streamed answer's headers go out, long before the body has streamed
    spans, truth = _unfinished()
    (http,) = [x for x in spans if x.kind == KIND_SERVER]
    http.end_ns = http.start_ns + 3 * f.MS
    r = _one(spans)
    assert r.e2e_ms == pytest.approx(spans[0].duration_ns / f.MS)
    assert r.decode_ms == pytest.approx(truth.decode, abs=0.01)
    assert s.FLAG_BUCKET_EXCEEDS_E2E not in r.flags


def test_infers_spans_named_as_handlers_are_no_requests_of_their_own() -> None:
    # Infer::generate and Infer::generate_stream carry handler names; compat_generate
    # calls the generate_stream handler (a handler below another span): one request each
    for handler in ("generate", "generate_stream"):
        spans, _ = f.tgi_trace(1.0, 10.0, 20.0, 5.0, 4, handler=handler)
        assert len(summarize_trace(spans).requests) == 1
    spans, _ = f.tgi_trace(1.0, 10.0, 20.0, 5.0, 4)
    (http,) = [x for x in spans if x.kind == KIND_SERVER]
    compat = f.span(http.trace_id, "compat_generate", 0, 100, http, resource=http.resource)
    spans[0].parent_span_id = compat.span_id
    assert len(summarize_trace([*spans, compat]).requests) == 1


def test_parent_ids_that_loop_keep_the_request() -> None:
    spans, _ = _unfinished()
    (http,) = [x for x in spans if x.kind == KIND_SERVER]
    http.parent_span_id = _named(spans, "infer")[-1].span_id  # the root under its own step
    assert len(summarize_trace(spans).requests) == 1


def _chain(names: list[str]) -> list[Span]:
    tid = f.new_id(32)
    spans: list[Span] = []
    parent = None
    for i, name in enumerate(names):
        parent = f.span(
            tid, name, i * 0.01, 1000 - i * 0.01, parent, resource={"service.name": "router"}
        )
        spans.append(parent)
    return spans


@pytest.mark.parametrize("shape", ["handlers", "handler_between_others", "handlers_side_by_side"])
def test_telling_tgi_by_its_inner_spans_is_linear_in_the_spans(
    monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    """Looking for `infer` / `queued` below each handler afresh walked a chain of n
    handler-named spans n^2/2 times (the hostile exports of test_attribution_cost.py)."""
    n = 1000
    if shape == "handlers":  # generate → generate → … → infer
        spans = _chain(["generate"] * n + ["infer"])
        want = 1
    elif shape == "handler_between_others":  # x → generate → x → generate → … → infer
        spans = _chain(["x", "generate"] * (n // 2) + ["infer"])
        want = 1
    else:  # n handlers, each above a chain of its own, with a step at the bottom
        spans = []
        for _ in range(n // 10):
            chain = _chain(["chat_completions", *["work"] * 9, "infer"])
            for x in chain:
                x.trace_id = "t"
            spans += chain
        want = n // 10
    monkeypatch.setattr(attribution, "TraceView", _CountingView)
    _CountingDict.looked = 0
    assert len(summarize_trace(spans).requests) == want
    assert _CountingDict.looked <= 30 * len(spans), _CountingDict.looked


def test_an_apps_spans_that_share_the_handlers_names_are_not_tgi() -> None:
    tid = f.new_id(32)
    app = {"service.name": "app"}
    outer = f.span(tid, "chat_completions", 0, 100, resource=app)
    inner = f.span(tid, "generate", 1, 90, outer, resource=app)
    assert all(r.source != "tgi" for r in summarize_trace([outer, inner]).requests)
