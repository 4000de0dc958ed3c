"""Request spans built off the host's thread: same ids, same content, eager where it must be."""

from __future__ import annotations

import sys
import time

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _cold_start
from tokentrace.instrumentation import semconv as sc
from tokentrace.instrumentation._pending_span import PendingSpan

PARENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


def test_the_built_span_has_the_ids_announced_at_the_start(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    with tt.request(model="m") as req:
        assert isinstance(req.span, PendingSpan)
        announced = req.span.get_span_context()
        header = req.traceparent()["traceparent"]
        token = otel_context.attach(trace.set_span_in_context(req.span))  # a library's span under it
        try:
            memory_sdk.tracing.tracer.start_span("library.call").end()
        finally:
            otel_context.detach(token)
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    (child,) = memory_sdk.spans("library.call")
    assert (span.context.trace_id, span.context.span_id) == (announced.trace_id, announced.span_id)
    assert announced.trace_flags.sampled
    assert header == f"00-{announced.trace_id:032x}-{announced.span_id:016x}-{announced.trace_flags:02x}"
    assert span.context.trace_flags == announced.trace_flags
    assert child.parent.span_id == span.context.span_id
    assert child.context.trace_id == span.context.trace_id


def test_a_continued_trace_keeps_its_id_state_and_parent(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    headers = {"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01", "tracestate": "vendor=abc"}
    with tt.request(headers=headers) as req:
        downstream = req.traceparent()
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert f"{span.context.trace_id:032x}" == PARENT_TRACE
    assert f"{span.parent.span_id:016x}" == PARENT_SPAN
    assert span.context.trace_state.get("vendor") == "abc"
    assert downstream["traceparent"] == f"00-{PARENT_TRACE}-{span.context.span_id:016x}-01"
    assert downstream["tracestate"] == "vendor=abc"


def test_an_unsampled_caller_still_gets_its_request_recorded(memory_sdk, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """docs/design.md §4: the collector summarizes every request; a gateway's head sampling
    must not take the request's numbers away.  The trace stays the caller's."""
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    with tt.request(headers={"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-00"}) as req:
        assert req.span.is_recording()
        downstream = req.traceparent()["traceparent"]
        with req.phase("prefill"):
            req.token()
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    (prefill,) = memory_sdk.spans(sc.PHASES["prefill"])
    assert f"{span.context.trace_id:032x}" == PARENT_TRACE
    assert f"{span.parent.span_id:016x}" == PARENT_SPAN and span.parent.is_remote
    assert span.context.trace_flags.sampled
    assert downstream == f"00-{PARENT_TRACE}-{span.context.span_id:016x}-01"  # recorded: sampled
    assert prefill.parent.span_id == span.context.span_id
    assert len(sc.unpack_list(span.attributes[sc.TOKEN_OFFSETS_US])) == 1


def test_a_sampler_the_host_names_follows_the_callers_decision(memory_sdk, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
    with tt.request(headers={"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-00"}) as req:
        assert not req.span.is_recording()
        assert req.traceparent()["traceparent"].endswith("-00")
        req.token()
    assert memory_sdk.spans() == []


def test_what_the_host_does_to_the_span_before_the_build_lands_on_it(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    req = tt.request()
    req.span.set_attribute("app.user_tier", "gold")
    req.span.add_event("cache.miss", {"cache.key": "k1"})
    req.span.update_name("my.request")
    req.set_tokens(prompt=7, output=99)
    for _ in range(3):
        req.token()
    req.finish(ValueError("boom"))
    (span,) = memory_sdk.spans("my.request")
    assert span.attributes["app.user_tier"] == "gold"
    assert span.attributes[sc.PROMPT_TOKENS] == 7
    assert span.attributes[sc.OUTPUT_TOKENS] == 99  # what the request said wins over the count
    assert [e.name for e in span.events] == ["cache.miss", "exception"]
    assert span.events[1].attributes["exception.type"] == "ValueError"
    assert span.status.status_code is StatusCode.ERROR
    assert len(sc.unpack_list(span.attributes[sc.TOKEN_OFFSETS_US])) == 3


def test_span_end_finishes_the_request(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    req = tt.request()
    req.span.end()
    req.token()  # after the end: not this request's any more
    (span,) = memory_sdk.spans(sc.SPAN_REQUEST)
    assert sc.TOKEN_OFFSETS_US not in span.attributes


def test_the_hosts_own_provider_gets_spans_at_once() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = tt.configure(service_name="own", tracer_provider=provider)
    try:
        assert tracing.pending_ids is None
        req = tt.request()
        assert isinstance(req.span, ReadableSpan)  # a live SDK span from the start
        req.finish()
        tracing.force_flush()
        assert [s.name for s in exporter.get_finished_spans()] == [sc.SPAN_REQUEST]
    finally:
        tt.shutdown()
        provider.shutdown()


def test_another_sampler_means_spans_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    exporter = InMemorySpanExporter()
    tracing = tt.configure(service_name="off", exporter=exporter)
    try:
        assert tracing.pending_ids is None
        with tt.request() as req:
            assert not isinstance(req.span, PendingSpan)
        tracing.force_flush()
        assert exporter.get_finished_spans() == ()
    finally:
        tt.shutdown()


def test_batch_forms_record_what_the_per_request_forms_do(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    _cold_start.tracker.reset()
    reqs = [tt.request() for _ in range(3)]
    ids = [r.request_id for r in reqs]
    with tt.engine_step(decode=ids[:2]) as step:
        step.decode_many(ids[2:])
        step.prefill("req-new", 5)
    tt.record_tokens(reqs)
    tt.record_tokens(reqs[:1])
    for r in reqs:
        r.finish()
    (steps,) = memory_sdk.spans(sc.SPAN_ENGINE_STEPS)
    assert sc.unpack_list(steps.attributes[sc.STEP_DECODE_SEQS]) == [3]
    assert sc.unpack_list(steps.attributes[sc.STEP_PREFILL_TOKENS]) == [5]
    assert sc.unpack_list(steps.attributes[sc.STEP_REQUEST_IDS]) == [",".join([*ids, "req-new"])]
    by_id = {s.attributes[sc.REQUEST_ID]: s for s in memory_sdk.spans(sc.SPAN_REQUEST)}
    offsets = [sc.unpack_list(by_id[i].attributes[sc.TOKEN_OFFSETS_US]) for i in ids]
    assert [len(o) for o in offsets] == [2, 1, 1]


def test_token_batches_give_each_member_its_own_token_times(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    _cold_start.tracker.reset()
    a, b, c = (tt.request() for _ in range(3))
    a.token()  # a prefilled alone: its first token on its own
    first = tt.TokenBatch([a, b])
    for _ in range(3):
        with tt.engine_step(decode=first.request_ids, tokens=first):
            pass
    first.token()
    assert (a.token_count, b.token_count, c.token_count) == (5, 4, 0)
    b.finish()
    second = tt.TokenBatch([a, c])  # b left, c joined
    first.token()  # a batch used after a member finished: no longer b's tokens
    with tt.engine_step(decode=second.request_ids, tokens=second):
        pass
    a.token()
    a.finish()
    c.finish()
    by_id = {s.attributes[sc.REQUEST_ID]: s for s in memory_sdk.spans(sc.SPAN_REQUEST)}
    offsets = {
        r: sc.unpack_list(by_id[r.request_id].attributes[sc.TOKEN_OFFSETS_US]) for r in (a, b, c)
    }
    assert [len(offsets[r]) for r in (a, b, c)] == [8, 4, 1]
    assert offsets[a] == sorted(offsets[a])  # its own tokens and its batches' merged in time
    assert by_id[a.request_id].attributes[sc.OUTPUT_TOKENS] == 8
    assert by_id[b.request_id].attributes[sc.OUTPUT_TOKENS] == 4
    steps = memory_sdk.spans(sc.SPAN_ENGINE_STEPS)
    assert sum(s.attributes[sc.STEP_COUNT] for s in steps) == 4


def _calls_in_finish(req: tt.RequestTrace) -> int:
    """Counts the Python and C calls `req.finish()` makes on the caller's thread."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(count)
    try:
        req.finish()
    finally:
        sys.setprofile(None)
    return calls


def test_finish_costs_the_host_the_same_however_often_the_batch_changed(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    # A loop whose batch changes every step puts a request in one TokenBatch a step: its
    # finish must not walk them on the host's thread (the flusher cuts them).
    steady, churned = tt.request(), tt.request()
    tt.TokenBatch([steady]).token()
    for _ in range(2_000):
        tt.TokenBatch([churned]).token()
    assert churned.token_count == 2_000
    assert _calls_in_finish(churned) - _calls_in_finish(steady) < 10
    by_id = {s.attributes[sc.REQUEST_ID]: s for s in memory_sdk.spans(sc.SPAN_REQUEST)}
    assert by_id[churned.request_id].attributes[sc.OUTPUT_TOKENS] == 2_000
    assert by_id[steady.request_id].attributes[sc.OUTPUT_TOKENS] == 1


def test_a_batch_token_timed_before_the_finish_is_the_requests_however_late_it_lands(memory_sdk) -> None:  # type: ignore[no-untyped-def]
    # An engine thread reads the clock for a step's tokens, then the handler finishes a
    # member before that thread appends the time: the token was produced before the end.
    req, other = tt.request(), tt.request()
    batch = tt.TokenBatch([req, other])
    batch.token()
    produced = time.monotonic_ns()
    req.finish()
    batch._times.append(produced)  # the engine thread's append, after the finish
    batch.token()  # produced after the finish: not req's
    other.finish()
    by_id = {s.attributes[sc.REQUEST_ID]: s for s in memory_sdk.spans(sc.SPAN_REQUEST)}
    assert by_id[req.request_id].attributes[sc.OUTPUT_TOKENS] == 2
    assert by_id[other.request_id].attributes[sc.OUTPUT_TOKENS] == 3
