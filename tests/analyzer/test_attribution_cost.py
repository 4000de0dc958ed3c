"""Summarizing a trace costs its spans, not their square: a chain of n request spans
(each the parent of the next), which a hostile or buggy sender can make, used to walk
n^2/2 parents and children (the security review: decisions stalled 12 s at 5,000
spans, 53 s at 10,000).  Work is counted (look-ups of a span's parent or children),
never timed."""

from __future__ import annotations

import random

import pytest

from tokentrace.analyzer import attribution
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, Span
from tokentrace.analyzer.trace_view import TraceView
from tokentrace.instrumentation import semconv as sc

from .counting_view import CountingDict as _CountingDict
from .counting_view import CountingView as _CountingView
from .spanfactory import MS, new_id, sdk_trace, span


def _chain(n: int, *, client: bool) -> list[Span]:
    """n SDK request spans, each the parent of the next, under a CLIENT span or not."""
    tid = new_id(32)
    top = (
        span(tid, "call", 0, n + 10, kind=KIND_CLIENT, resource={"service.name": "app"})
        if client
        else None
    )
    spans = [top] if top is not None else []
    parent = top
    for i in range(n):
        req = span(tid, sc.SPAN_REQUEST, i * 0.5, n - i * 0.5, parent, kind=KIND_SERVER,
                   attrs={sc.REQUEST_ID: f"r{i}"}, resource={"service.name": "svc"})  # fmt: skip
        spans.append(req)
        parent = req
    return spans


@pytest.mark.parametrize("client", [False, True])
def test_a_chain_of_requests_is_summarized_in_work_linear_in_its_spans(
    monkeypatch: pytest.MonkeyPatch, client: bool
) -> None:
    n = 1000
    spans = _chain(n, client=client)
    monkeypatch.setattr(attribution, "TraceView", _CountingView)
    _CountingDict.looked = 0
    result = summarize_trace(spans)
    assert len(result.requests) == n
    # a walk up (outermost span, client side) and one down (phases) a request: ~4n;
    # walking them afresh for each request was ~n^2 (1,000,000 here)
    assert _CountingDict.looked <= 20 * n, _CountingDict.looked
    for r in result.requests:
        assert r.e2e_ms >= 0 and "root_missing" not in r.flags
        assert (r.network_ms is not None) == client


def test_a_nested_request_keeps_its_phases_to_itself() -> None:
    """A request span inside another is a request of its own: its queue, prefill and
    decode are its own, not also the outer request's."""
    inner, truth = sdk_trace(tokenize=2, queue=30, prefill=20, itl=5, tokens=8)
    tid = inner[0].trace_id
    for x in inner:
        x.trace_id = tid
    outer = span(tid, sc.SPAN_REQUEST, -20, 200, kind=KIND_SERVER,
                 attrs={sc.REQUEST_ID: "outer"}, resource={"service.name": "gateway"})  # fmt: skip
    own_queue = span(tid, sc.SPAN_QUEUE, -20, 10, outer)
    inner[0].parent_span_id = outer.span_id
    result = summarize_trace([outer, own_queue, *inner])
    by_id = {r.request_id: r for r in result.requests}
    assert set(by_id) == {"outer", inner[0].attributes[sc.REQUEST_ID]}
    assert by_id["outer"].queue_wait_ms == pytest.approx(10)  # its own queue only, not 10 + 30
    got = by_id[inner[0].attributes[sc.REQUEST_ID]]
    assert got.queue_wait_ms == pytest.approx(30) and got.prefill_ms == pytest.approx(truth.prefill)


def test_descendants_until_a_name_neither_gives_nor_enters_those_spans() -> None:
    tid = new_id(32)
    root = span(tid, "r", 0, 10)
    a = span(tid, "a", 0, 1, root)
    stop = span(tid, "stop", 0, 1, root)
    below_stop = span(tid, "b", 0, 1, stop)
    below_a = span(tid, "c", 0, 1, a)
    view = TraceView([root, a, stop, below_stop, below_a])
    assert {x.name for x in view.descendants(root)} == {"a", "stop", "b", "c"}
    assert {x.name for x in view.descendants(root, until="stop")} == {"a", "c"}


def test_top_and_client_span_of_answer_as_the_walk_up_does_loops_included() -> None:
    """Remembered answers are the plain walk's (`ancestors`) on random parent links:
    chains, missing parents, loops of parent ids and spans leading into them, asked in
    any order."""
    rng = random.Random(7)
    for _ in range(2000):
        n = rng.randint(1, 12)
        ids = [new_id() for _ in range(n)]
        spans = []
        for i in range(n):
            r = rng.random()
            parent = "" if r < 0.15 else (new_id() if r < 0.25 else rng.choice(ids))
            kind = KIND_CLIENT if rng.random() < 0.3 else KIND_INTERNAL
            spans.append(Span("t" * 32, ids[i], parent, "x", kind, 0, MS))
        view = TraceView(spans)
        for s in rng.sample(spans, n):
            above = list(view.ancestors(s))
            want_top = above[-1] if above else s
            want_client = next((a for a in above if a.kind == KIND_CLIENT), None)
            if rng.random() < 0.5:
                assert view.top(s) is want_top
                assert view.client_span_of(s) is want_client
            else:
                assert view.client_span_of(s) is want_client
                assert view.top(s) is want_top


def test_a_repeated_span_id_is_answered_by_the_walk_not_the_memory() -> None:
    tid = new_id(32)
    client = span(tid, "c", 0, 10, kind=KIND_CLIENT)
    first = span(tid, "x", 0, 1, client)
    second = Span(tid, first.span_id, "", "x", KIND_INTERNAL, 0, 1)  # same id, no parent
    view = TraceView([first, second])  # by_id keeps `second`
    assert view.top(second) is second and view.client_span_of(second) is None
    assert view.client_span_of(first) is None  # its parent is not in this view
    view = TraceView([client, second, first])  # by_id keeps `first`
    assert view.top(first) is client and view.client_span_of(first) is client
    assert view.top(second) is second and view.client_span_of(second) is None


def test_a_chain_beside_a_client_only_call_is_summarized_in_linear_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a client span that is no request's caller is summarized on its own
    # (attribution._calls_beside): claiming the requests' spans walked each
    # request's ancestors and descendants afresh, n^2 for a chain
    n = 1000
    spans = _chain(n, client=False)
    beside = span(spans[0].trace_id, sc.SPAN_CLIENT, 0, 50, kind=KIND_CLIENT,
                  attrs={sc.CLIENT_TTFC_S: 0.01}, resource={"service.name": "app"})  # fmt: skip
    monkeypatch.setattr(attribution, "TraceView", _CountingView)
    _CountingDict.looked = 0
    result = summarize_trace([*spans, beside])
    assert len(result.requests) == n + 1
    assert _CountingDict.looked <= 20 * n, _CountingDict.looked


def test_llm_calls_deep_in_a_trace_are_told_outer_in_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    # wrappers nest (an SDK call inside an app's call): only the outermost are requests,
    # found by looking up from each client span; n calls at the bottom of n internal
    # spans were each walked up all of them
    n = 1000
    tid = new_id(32)
    spans: list[Span] = []
    parent = None
    for i in range(n):
        parent = span(tid, "work", i * 0.01, 100 - i * 0.01, parent, kind=KIND_INTERNAL,
                      resource={"service.name": "app"})  # fmt: skip
        spans.append(parent)
    for i in range(n):
        spans.append(span(tid, sc.SPAN_CLIENT, 20 + i * 0.01, 1, parent, kind=KIND_CLIENT,
                          resource={"service.name": "app"}))  # fmt: skip
    monkeypatch.setattr(attribution, "TraceView", _CountingView)
    _CountingDict.looked = 0
    result = summarize_trace(spans)
    assert len(result.requests) == n
    assert _CountingDict.looked <= 20 * n, _CountingDict.looked
