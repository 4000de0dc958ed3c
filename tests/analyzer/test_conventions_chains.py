"""TGI's and SGLang's requests are found in work linear in the trace's spans.

Each adapter summarizes the outermost of its request spans only (a TGI handler inside
another, an SGLang root inside another, is part of it), and used to find them by
walking every candidate's ancestors afresh: a chain of n spans with a request hung
from each, which a hostile or buggy sender can make, walked n^2/2 parents.  Work is
counted (look-ups of a span's parent or children, as in test_attribution_cost), never timed.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable

import pytest

from tokentrace.analyzer import attribution
from tokentrace.analyzer import summary as s
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.conventions import sglang, tgi
from tokentrace.analyzer.conventions._common import inside_any
from tokentrace.analyzer.spans import KIND_INTERNAL, Span
from tokentrace.analyzer.trace_view import TraceView

from .spanfactory import MS, new_id, span
from .test_attribution_cost import _CountingDict, _CountingView

N = 2000
TGI_TIMING = {tgi.TOTAL: "10ms", tgi.VALIDATION: "100µs", tgi.QUEUE: "1ms", tgi.INFERENCE: "8ms",
              tgi.PER_TOKEN: "2ms"}  # fmt: skip
TGI_SERVICE = {"service.name": "text-generation-inference.router"}
SGLANG_SERVICE = {"service.name": "sglang"}


def _tgi_handler_per_step(n: int) -> list[Span]:
    """n `infer` spans, each the parent of the next, a `generate` handler hung from each:
    n requests (none lies inside another handler)."""
    tid = new_id(32)
    spans: list[Span] = []
    step = None
    for i in range(n):
        step = span(tid, tgi.SPAN_INFER, i * 0.01, 100 - i * 0.01, step, resource=TGI_SERVICE)
        spans.append(step)
        spans.append(
            span(tid, "generate", i * 0.01, 10, step, attrs={**TGI_TIMING, "request_id": f"t{i}"})
        )
    return spans


def _sglang_root_per_thread(n: int) -> list[Span]:
    """n thread spans, each the parent of the next, a root `" Req r<i>"` hung from each:
    n requests (their rid8s differ)."""
    tid = new_id(16)
    spans: list[Span] = []
    thread = None
    for i in range(n):
        thread = span(
            tid,
            "Scheduler [TP 0] (pid 8)",
            i * 0.01,
            100 - i * 0.01,
            thread,
            resource=SGLANG_SERVICE,
        )
        spans.append(thread)
        spans.append(span(tid, f" Req r{i}", i * 0.01, 10, thread, attrs={sglang.E2E: 0.01}))
    return spans


def _sglang_rooms(n: int) -> list[Span]:
    """n `Bootstrap Room` spans, each the parent of the next, a `prefill Req` root of one
    room hung from each: the roots of one request."""
    tid = new_id(16)
    spans: list[Span] = []
    room = None
    for i in range(n):
        room = span(tid, "Bootstrap Room 0x1f", i * 0.01, 100 - i * 0.01, room, resource=SGLANG_SERVICE,
                    attrs={sglang.BOOTSTRAP_ROOM: "0x1f"})  # fmt: skip
        spans.append(room)
        spans.append(span(tid, f"prefill Req p{i}", i * 0.01, 10, room))
    return spans


def _tgi_nested_handlers(n: int) -> list[Span]:
    """n TGI handlers, each the parent of the next (chat_completions around
    generate_stream, n deep), with one `queued` and one `infer` under the innermost:
    one request, the outermost."""
    tid = new_id(32)
    spans: list[Span] = []
    handler = None
    for i in range(n):
        name = "chat_completions" if i % 2 == 0 else "generate_stream"
        handler = span(tid, name, i * 0.01, 100 - i * 0.02, handler, resource=TGI_SERVICE,
                       attrs={**TGI_TIMING, "request_id": f"t{i}"})  # fmt: skip
        spans.append(handler)
    assert handler is not None
    spans.append(span(tid, tgi.SPAN_QUEUED, n * 0.01, 1, handler))
    spans.append(span(tid, tgi.SPAN_INFER, n * 0.01 + 1, 2, handler))
    return spans


def _sglang_nested_roots(n: int) -> list[Span]:
    """n SGLang roots, each the parent of the next, with the slices under the innermost:
    one request, the outermost."""
    tid = new_id(16)
    spans: list[Span] = []
    root = None
    for i in range(n):
        root = span(tid, f" Req r{i}", i * 0.01, 100 - i * 0.02, root, resource=SGLANG_SERVICE)
        spans.append(root)
    assert root is not None
    t = n * 0.01
    spans.append(span(tid, sglang.SLICE_PREFILL_WAIT, t, 1, root))
    spans.append(span(tid, sglang.SLICE_PREFILL, t + 1, 2, root))
    spans.append(span(tid, sglang.SLICE_DECODE, t + 3, 5, root))
    return spans


#: builder, source, the requests it makes, the request id of the first
CHAINS: dict[str, tuple[Callable[[int], list[Span]], str, int, str]] = {
    "tgi_handler_per_step": (_tgi_handler_per_step, tgi.NAME, N, "t0"),
    "tgi_nested_handlers": (_tgi_nested_handlers, tgi.NAME, 1, "t0"),
    "sglang_root_per_thread": (_sglang_root_per_thread, sglang.NAME, N, "r0"),
    "sglang_rooms": (_sglang_rooms, sglang.NAME, 1, "p0"),
    "sglang_nested_roots": (_sglang_nested_roots, sglang.NAME, 1, "r0"),
}


@pytest.mark.parametrize("chain", CHAINS)
def test_a_chain_is_summarized_in_work_linear_in_its_spans(
    monkeypatch: pytest.MonkeyPatch, chain: str
) -> None:
    build, source, n_requests, _ = CHAINS[chain]
    spans = build(N)
    monkeypatch.setattr(attribution, "TraceView", _CountingView)
    _CountingDict.looked = 0
    result = summarize_trace(spans)
    assert len(result.requests) == n_requests
    assert {r.source for r in result.requests} == {source}
    # a walk up from each candidate, remembered, and one down from each request: a few
    # per span; walking each candidate's ancestors afresh was ~N^2/2 (2,000,000 here)
    assert _CountingDict.looked <= 20 * N, _CountingDict.looked


@pytest.mark.parametrize("chain", CHAINS)
def test_a_chain_gives_one_sound_summary_per_request(
    caplog: pytest.LogCaptureFixture, chain: str
) -> None:
    build, source, n_requests, first_id = CHAINS[chain]
    spans = build(300)
    n_requests = min(n_requests, 300)
    with caplog.at_level(logging.ERROR, logger="tokentrace.analyzer"):
        result = summarize_trace(spans)
    assert not caplog.records  # no adapter failed on it
    requests = result.requests
    assert len(requests) == n_requests
    assert len({r.request_id for r in requests}) == n_requests
    assert requests[0].request_id == first_id  # the outermost request span, in span order
    for r in requests:
        assert r.source == source
        assert r.e2e_ms > 0
        assert min(r.queue_ms, r.prefill_ms, r.decode_ms) >= 0
        assert r.queue_ms + r.prefill_ms + r.decode_ms == pytest.approx(r.e2e_ms)
        assert s.FLAG_BUCKET_EXCEEDS_E2E not in r.flags


def test_the_outermost_of_nested_requests_keeps_what_lies_below() -> None:
    spans = _tgi_nested_handlers(50)
    [got] = summarize_trace(spans).requests
    assert got.e2e_ms == pytest.approx(100)  # the outermost handler's duration
    assert got.prefill_ms == pytest.approx(2)  # the innermost's infer step
    assert got.queue_wait_ms == pytest.approx(1)
    spans = _sglang_nested_roots(50)
    [got] = summarize_trace(spans).requests
    assert got.e2e_ms == pytest.approx(100)
    assert (got.queue_wait_ms, got.prefill_ms, got.decode_ms) == pytest.approx((1, 2, 5))


def test_inside_any_answers_as_the_walk_up_does_loops_and_repeated_ids_included() -> None:
    """Remembered answers are the plain walk's (`ancestors`) on random parent links:
    chains, missing parents, loops of parent ids and spans leading into them, repeated
    span ids, asked in any order."""
    rng = random.Random(11)
    for _ in range(3000):
        n = rng.randint(1, 12)
        ids = [new_id() for _ in range(n)]
        if rng.random() < 0.2:  # a span id sent twice
            ids[rng.randrange(n)] = rng.choice(ids)
        spans = []
        for i in range(n):
            r = rng.random()
            parent = "" if r < 0.15 else (new_id() if r < 0.25 else rng.choice(ids))
            name = "m" if rng.random() < 0.3 else "x"
            spans.append(Span("t" * 32, ids[i], parent, name, KIND_INTERNAL, 0, MS))
        view = TraceView(spans)
        inside = inside_any(view, lambda x: x.name == "m")
        for x in rng.sample(spans, n):
            assert inside(x) == any(a.name == "m" for a in view.ancestors(x))


#: The regular expression the SGLang adapter read root names with: the oracle.
ROOT_NAME = re.compile(r"^\s*(?:(?:prefill|decode)\s+)?Req(?:\s+(.*?))?\s*$")
NAME_PARTS = (" ", "  ", "\t", "\n", "\r", "\u00a0", "\u2028", "\x1c", "Req", "req", "prefill", "decode",
              "router", "Bootstrap Room", "a", "x1", "é", "-", "R", "eq", ".")  # fmt: skip


def _oracle_rid8(name: str) -> str | None:
    m = ROOT_NAME.match(name)
    return None if m is None else m.group(1) or ""


@pytest.mark.parametrize(
    "name",
    [" Req 1a2b3c4d", "Req 1a2b3c4d", "prefill Req ab", "decode Req ab", "  decode\tReq  ab  ", " Req ",
     " Req", "Req\n", "Req a\n", "Req a\nb", "Req \n a", "Reqs", "router Req ab", "prefillReq ab",
     "prefill Reqab", "prefill  ", "decode decode Req a", "Req a b  c ", "Req\u00a0a\u00a0"],
)  # fmt: skip
def test_root_names_are_read_as_the_regular_expression_read_them(name: str) -> None:
    assert sglang._root_rid8(name) == _oracle_rid8(name)


def test_random_root_names_are_read_as_the_regular_expression_read_them() -> None:
    rng = random.Random(5)
    for _ in range(20000):
        name = "".join(rng.choice(NAME_PARTS) for _ in range(rng.randint(0, 8)))
        assert sglang._root_rid8(name) == _oracle_rid8(name), repr(name)


@pytest.mark.timeout(20)  # the regular expression took minutes on this name (quadratic)
def test_a_root_name_with_a_long_run_of_blanks_is_read_in_linear_work() -> None:
    blanks = " " * 200_000
    tid = new_id(16)
    root = span(tid, f" Req a{blanks}b{blanks}", 0, 10, resource=SGLANG_SERVICE)
    # two lines: no root, however long
    lookalike = span(tid, f" Req a{blanks}\nb", 0, 10, resource=SGLANG_SERVICE)
    [got] = summarize_trace([root, lookalike]).requests
    assert got.request_id == f"a{blanks}b"
