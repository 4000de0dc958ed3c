"""network = the user's client span − the OUTERMOST server span; E = the user's client
span (docs/design.md §2).

The user's client span is the outermost CLIENT span above the request; the server's
time is the outermost SERVER span between the two (a proxy, a gateway, an HTTP server
span around the request), whose extra time is queue (`other`).  These used to take the
nearest client span (a proxy's outbound hop) and the request's own span: a proxy's 30 ms
and the user's 60 ms of wire were lost from E, and an HTTP server span's middleware time
was booked as network.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from tokentrace.analyzer import attribution
from tokentrace.analyzer import summary as s
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.conventions import genai_client
from tokentrace.analyzer.conventions._sides import RequestSides, Sides
from tokentrace.analyzer.spans import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, Span
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.analyzer.trace_view import TraceView
from tokentrace.instrumentation import semconv as sc

from . import spanfactory as f
from .counting_view import CountingDict as _CountingDict
from .counting_view import CountingView as _CountingView
from .spanfactory import MS, Truth, new_id, span

T0 = 1_700_000_000 * 10**9
_LLM = {"gen_ai.operation.name": "chat"}


def _at(x: Span) -> float:
    return (x.start_ns - T0) / MS


def _dur(x: Span) -> float:
    return x.duration_ns / MS


def _root(spans: list[Span]) -> Span:
    return next(x for x in spans if not x.parent_span_id)


def _one(spans: list[Span]) -> RequestSummary:
    (r,) = summarize_trace(spans).requests
    return r


def _adds_up(r: RequestSummary) -> None:
    parts = (r.network_ms or 0.0) + r.queue_ms + r.prefill_ms + r.decode_ms
    assert parts == pytest.approx(r.e2e_ms, abs=1e-6)
    assert r.queue_wait_ms + r.tokenize_ms + r.other_ms == pytest.approx(r.queue_ms, abs=1e-6)


def _behind_proxy(
    spans: list[Span], *, hop: float = 4.0, proxy: float = 30.0, wire: float = 60.0
) -> list[Span]:
    """Puts the user's GenAI client span → a proxy's SERVER span → the proxy's outbound
    CLIENT span above the trace's root (the s9 review case)."""
    root = _root(spans)
    tid = root.trace_id
    out = span(tid, "POST", _at(root) - hop / 2, _dur(root) + hop, kind=KIND_CLIENT,
               attrs={"http.request.method": "POST"}, resource={"service.name": "proxy"})  # fmt: skip
    srv = span(tid, "POST /v1/chat/completions", _at(out) - 20, _dur(out) + proxy, kind=KIND_SERVER,
               resource={"service.name": "proxy"})  # fmt: skip
    user = span(tid, "chat llama", _at(srv) - wire / 2, _dur(srv) + wire, kind=KIND_CLIENT,
                attrs=dict(_LLM), resource={"service.name": "app"})  # fmt: skip
    out.parent_span_id, srv.parent_span_id, root.parent_span_id = (
        srv.span_id,
        user.span_id,
        out.span_id,
    )
    return [user, srv, out, *spans]


BUILDERS: dict[str, Callable[[], tuple[list[Span], Truth]]] = {
    "tokentrace": lambda: f.sdk_trace(2, 10, 50, 20, 10),
    "vllm": lambda: f.vllm_trace(30, 120, 400),
    "sglang": lambda: f.sglang_trace(3, 25, 90, 300),
    "tgi": lambda: f.tgi_trace(2, 15, 80, 20, 11),
}


@pytest.mark.parametrize("source", sorted(BUILDERS))
def test_a_proxy_between_user_and_server_is_queue_and_the_user_span_is_e2e(source: str) -> None:
    spans, truth = BUILDERS[source]()
    spans = _behind_proxy(spans, hop=4.0, proxy=30.0, wire=60.0)
    r = _one(spans)
    assert r.source == source
    assert r.e2e_ms == pytest.approx(truth.e2e + 4 + 30 + 60, abs=0.01)
    assert r.network_ms == pytest.approx(60.0, abs=0.01)
    # the proxy's own 30 ms and its 4 ms hop are queue: gateway time (docs/design.md §2)
    assert r.queue_ms == pytest.approx(truth.queue + 34, abs=0.01)
    assert r.prefill_ms == pytest.approx(truth.prefill, abs=0.01)
    assert r.decode_ms == pytest.approx(truth.decode, abs=0.01)
    assert r.start_ns == spans[0].start_ns  # the user's span: where E starts
    _adds_up(r)


def test_the_review_proxy_case_in_numbers() -> None:
    """s9: request span 246 ms; proxy hop 4, proxy 30, user wire 60."""
    spans, _ = f.sdk_trace(2, 10, 50, 20, 10)  # 2 + 10 + 50 + 9 × 20 = 242 ms
    spans = _behind_proxy(spans)
    r = _one(spans)
    user = spans[0]
    assert (r.e2e_ms, r.network_ms, r.queue_ms, r.prefill_ms, r.decode_ms) == pytest.approx(
        (_dur(user), 60.0, 12.0 + 34.0, 50.0, 180.0)
    )
    assert r.start_ns == user.start_ns
    # the gateway's time lands in `other`; the measured parts stay what they were
    assert (r.queue_wait_ms, r.tokenize_ms, r.other_ms) == pytest.approx((10.0, 2.0, 34.0))


def _http_server_around(
    spans: list[Span], middleware: float, *, service: str | None = None
) -> Span:
    """Puts an HTTP SERVER span (FastAPI's instrumentation, say) with `middleware` ms of
    its own around the request span, under the request's parent (if any)."""
    req = next(x for x in spans if x.name == sc.SPAN_REQUEST)
    http = span(req.trace_id, "POST /v1/chat", _at(req) - middleware / 2, _dur(req) + middleware,
                kind=KIND_SERVER, attrs={"http.route": "/v1/chat"},
                resource={"service.name": service} if service else dict(req.resource))  # fmt: skip
    http.parent_span_id, req.parent_span_id = req.parent_span_id, http.span_id
    spans.append(http)
    return http


def test_an_http_server_span_around_the_request_gives_its_middleware_to_queue() -> None:
    """s1 `http_server_outer`: 25 ms of middleware outside the request span were network."""
    spans, truth = f.sdk_trace(2, 10, 50, 20, 10, wire=30.0)
    client = next(x for x in spans if x.kind == KIND_CLIENT)
    client.start_ns -= round(12.5 * MS)
    client.end_ns += round(12.5 * MS)
    _http_server_around(spans, 25.0)
    r = _one(spans)
    assert r.e2e_ms == pytest.approx(truth.e2e + 25)
    assert r.network_ms == pytest.approx(30.0)
    assert r.queue_ms == pytest.approx(truth.queue + 25)
    assert r.other_ms == pytest.approx(25.0)
    assert r.route == "/v1/chat"
    _adds_up(r)


def test_without_a_client_an_http_server_span_of_the_same_service_is_the_server() -> None:
    spans, truth = f.sdk_trace(2, 10, 50, 20, 10)
    http = _http_server_around(spans, 25.0)
    r = _one(spans)
    assert r.network_ms is None
    assert r.e2e_ms == pytest.approx(truth.e2e + 25)
    assert r.queue_ms == pytest.approx(truth.queue + 25)
    assert r.start_ns == http.start_ns


def test_without_a_client_a_server_span_of_another_service_is_not_placed() -> None:
    """A gateway's span with no client span between it and the request: the wire to the
    request was not traced, so the gateway's time cannot be split; the request's stands."""
    spans, truth = f.sdk_trace(2, 10, 50, 20, 10)
    _http_server_around(spans, 25.0, service="gateway")
    r = _one(spans)
    assert r.network_ms is None
    assert r.e2e_ms == pytest.approx(truth.e2e)
    assert r.queue_ms == pytest.approx(truth.queue)


def test_an_apps_own_incoming_server_span_above_its_call_is_never_the_llm_servers() -> None:
    """An app that is itself a web server: its SERVER span lies above its outbound LLM
    client span, which is the user's side of the request."""
    spans, truth = f.sdk_trace(2, 10, 50, 20, 10, wire=40.0)
    client = next(x for x in spans if x.kind == KIND_CLIENT)
    app = span(client.trace_id, "GET /answer", _at(client) - 300, _dur(client) + 600, kind=KIND_SERVER,
               resource=dict(client.resource))  # fmt: skip
    client.parent_span_id = app.span_id
    r = _one([app, *spans])
    assert r.e2e_ms == pytest.approx(truth.e2e)
    assert r.network_ms == pytest.approx(40.0)
    assert r.queue_ms == pytest.approx(truth.queue)


def test_a_client_span_shorter_than_the_outermost_server_span_is_clamped_and_flagged() -> None:
    spans, truth = f.sdk_trace(2, 10, 50, 20, 10)
    spans = _behind_proxy(spans, wire=-10.0)  # the user's clock says 10 ms less than the proxy's
    r = _one(spans)
    assert r.network_ms == 0.0
    assert s.FLAG_NEGATIVE_NETWORK in r.flags
    assert r.e2e_ms == pytest.approx(truth.e2e + 34)  # the outermost server span bounds E
    _adds_up(r)


def test_retried_attempts_under_one_call_keep_their_own_client_spans() -> None:
    """One GenAI client span, two HTTP attempts (a retry), each reaching the server: a
    span above both requests is neither one's, or each would count the other's time."""
    first, t1 = f.sdk_trace(2, 10, 50, 20, 10)
    second, t2 = f.sdk_trace(2, 10, 50, 20, 10)
    tid = first[0].trace_id
    for x in second:
        x.trace_id = tid
    req1, req2 = first[0], second[0]
    req2.start_ns += 400 * MS
    req2.end_ns += 400 * MS
    call = span(tid, "chat llama", _at(req1) - 50, 400 + _dur(req2) + 100, kind=KIND_CLIENT,
                attrs=dict(_LLM), resource={"service.name": "app"})  # fmt: skip
    attempts = []
    for req in (req1, req2):
        a = span(tid, "POST", _at(req) - 5, _dur(req) + 10, parent=call, kind=KIND_CLIENT)
        req.parent_span_id = a.span_id
        attempts.append(a)
    got = {r.request_id: r for r in summarize_trace([call, *attempts, *first, *second]).requests}
    for req, truth in ((req1, t1), (req2, t2)):
        r = got[req.attributes[sc.REQUEST_ID]]
        assert r.network_ms == pytest.approx(10.0)
        assert r.e2e_ms == pytest.approx(truth.e2e + 10)


def test_one_server_span_around_two_requests_is_neither_ones() -> None:
    """An app that runs two generations in one HTTP request (in process): its server span
    is not either request's server time."""
    first, t1 = f.sdk_trace(2, 10, 50, 20, 10)
    second, t2 = f.sdk_trace(2, 10, 50, 20, 10)
    tid = first[0].trace_id
    for x in second:
        x.trace_id = tid
        x.resource = dict(first[0].resource)
    http = span(tid, "POST /agent", -10, 600, kind=KIND_SERVER, resource=dict(first[0].resource))
    first[0].parent_span_id = second[0].parent_span_id = http.span_id
    got = summarize_trace([http, *first, *second]).requests
    assert sorted(r.e2e_ms for r in got) == pytest.approx(sorted([t1.e2e, t2.e2e]))


def test_a_chain_of_nested_requests_under_a_client_keeps_the_nearest_client() -> None:
    """A request span around another is a request of its own, never the inner one's
    server span; where no client span is a request's alone, the nearest is its client."""
    tid = new_id(32)
    client = span(tid, "call", 0, 110, kind=KIND_CLIENT, resource={"service.name": "app"})
    outer = span(tid, sc.SPAN_REQUEST, 5, 100, client, kind=KIND_SERVER, attrs={sc.REQUEST_ID: "outer"},
                 resource={"service.name": "svc"})  # fmt: skip
    inner = span(
        tid, sc.SPAN_REQUEST, 10, 80, outer, kind=KIND_SERVER, attrs={sc.REQUEST_ID: "inner"}
    )
    got = {r.request_id: r for r in summarize_trace([client, outer, inner]).requests}
    assert got["outer"].network_ms == pytest.approx(10.0)
    assert got["inner"].network_ms == pytest.approx(30.0)
    assert got["inner"].e2e_ms == pytest.approx(110.0)


def test_an_llm_call_beside_the_request_makes_the_spans_above_both_shared() -> None:
    """A user's client → an agent's handler → (a call to a traced server, a call to an
    untraced one): the handler is not the traced request's server span."""
    spans, truth = f.sdk_trace(2, 10, 50, 20, 10, wire=40.0)
    client = next(x for x in spans if x.kind == KIND_CLIENT)
    tid = client.trace_id
    agent = span(tid, "POST /agent", _at(client) - 200, _dur(client) + 900, kind=KIND_SERVER,
                 resource={"service.name": "agent"})  # fmt: skip
    browser = span(tid, "fetch /agent", _at(agent) - 20, _dur(agent) + 40, kind=KIND_CLIENT,
                   resource={"service.name": "browser"})  # fmt: skip
    other = span(tid, "chat gpt-x", _at(client) + _dur(client) + 10, 300, agent, kind=KIND_CLIENT,
                 attrs={**_LLM, "gen_ai.usage.output_tokens": 3})  # fmt: skip
    agent.parent_span_id = browser.span_id
    client.parent_span_id = agent.span_id
    got = summarize_trace([browser, agent, other, *spans]).requests
    (served,) = [r for r in got if r.source == "tokentrace"]
    assert served.network_ms == pytest.approx(40.0)
    assert served.e2e_ms == pytest.approx(truth.e2e)  # the call, not the browser's fetch


# ---- the memoized answers are the plain walk's; the work is linear -----------------


def _reference(view: TraceView, groups: list[list[Span]], request: Span) -> Sides:
    """The rule of `_sides.py` walked plainly, from each span, every time."""
    above: list[set[str]] = []
    for g in groups:
        above.append({y.span_id for x in g for y in (x, *view.ancestors(x))})
    ours = {id(x) for g in groups for x in g}
    claimed = set().union(*above) if above else set()
    for c in genai_client.outer_clients(view):
        if c.span_id not in claimed and not any(id(a) in ours for a in view.ancestors(c)):
            mine = {c.span_id, *(a.span_id for a in view.ancestors(c))}
            above.append(mine)
            claimed |= mine
    me = next(i for i, g in enumerate(groups) if any(x is request for x in g))
    own = []
    for a in view.ancestors(request):
        if a.span_id not in above[me] or any(
            a.span_id in other for j, other in enumerate(above) if j != me
        ):
            break
        own.append(a)
    clients = [i for i, a in enumerate(own) if a.kind == KIND_CLIENT]
    if clients:
        c = clients[-1]
        servers = [a for a in own[:c] if a.kind == KIND_SERVER]
        return Sides(own[c], servers[-1] if servers else None)
    nearest = next((a for a in view.ancestors(request) if a.kind == KIND_CLIENT), None)
    if nearest is not None:
        servers = [a for a in own if a.kind == KIND_SERVER]
        return Sides(nearest, servers[-1] if servers else None)
    run = []
    for a in own:
        if a.service_name != request.service_name:
            break
        run.append(a)
    servers = [a for a in run if a.kind == KIND_SERVER]
    return Sides(None, servers[-1] if servers else None)


def test_sides_are_the_plain_walks_on_random_parent_links() -> None:
    """Chains, missing parents, loops of parent ids and spans leading into them; client,
    server and internal spans of two services; requests and client-only LLM calls."""
    rng = random.Random(29)
    for _ in range(3000):
        n = rng.randint(1, 12)
        ids = [new_id() for _ in range(n)]
        spans = []
        for i in range(n):
            r = rng.random()
            parent = "" if r < 0.15 else (new_id() if r < 0.25 else rng.choice(ids))
            kind = rng.choice((KIND_CLIENT, KIND_SERVER, KIND_INTERNAL))
            name = sc.SPAN_REQUEST if rng.random() < 0.3 else f"x{i}"
            attrs = dict(_LLM) if kind == KIND_CLIENT and rng.random() < 0.4 else {}
            spans.append(Span("t" * 32, ids[i], parent, name, kind, 0, MS, attributes=attrs,
                              resource={"service.name": rng.choice("ab")}))  # fmt: skip
        rng.shuffle(spans)
        view = TraceView(spans)
        requests = [x for x in spans if x.name == sc.SPAN_REQUEST]
        groups = [[x] for x in requests]
        sides = RequestSides(view, groups)
        for req in rng.sample(requests, len(requests)):
            got, want = sides.of(req), _reference(view, groups, req)
            assert (got.client, got.server) == (want.client, want.server), [
                (x.name, x.kind, x.span_id, x.parent_span_id, x.service_name) for x in spans
            ]


def _comb(n: int) -> list[Span]:
    """A client, n server spans each the parent of the next, a request hung from each."""
    tid = new_id(32)
    parent = span(
        tid, "call", 0, 10 * n, kind=KIND_CLIENT, attrs=dict(_LLM), resource={"service.name": "app"}
    )
    spans = [parent]
    for i in range(n):
        parent = span(
            tid,
            "hop",
            i,
            10 * n - 2 * i,
            parent,
            kind=KIND_SERVER,
            resource={"service.name": "svc"},
        )
        spans.append(parent)
        spans.append(
            span(
                tid,
                sc.SPAN_REQUEST,
                i + 1,
                5,
                parent,
                kind=KIND_SERVER,
                attrs={sc.REQUEST_ID: f"r{i}"},
            )
        )
    return spans


def _deep(n: int) -> list[Span]:
    """One request under n server and client spans: all of them the request's own."""
    tid = new_id(32)
    parent = None
    spans = []
    for i in range(n):
        parent = span(tid, "hop", i, 10 * n - 2 * i, parent, kind=KIND_CLIENT if i % 2 else KIND_SERVER,
                      resource={"service.name": "svc"})  # fmt: skip
        spans.append(parent)
    spans.append(
        span(tid, sc.SPAN_REQUEST, n, 5, parent, kind=KIND_SERVER, attrs={sc.REQUEST_ID: "r"})
    )
    return spans


def _loop(n: int) -> list[Span]:
    """n spans whose parent ids go round in a loop, a request hung from each."""
    tid = new_id(32)
    ids = [new_id() for _ in range(n)]
    spans = []
    for i in range(n):
        kind = (KIND_CLIENT, KIND_SERVER, KIND_INTERNAL)[i % 3]
        spans.append(
            Span(
                tid, ids[i], ids[(i + 1) % n], "hop", kind, 0, MS, resource={"service.name": "svc"}
            )
        )
        spans.append(Span(tid, new_id(), ids[i], sc.SPAN_REQUEST, KIND_SERVER, 0, MS,
                          attributes={sc.REQUEST_ID: f"r{i}"}, resource={"service.name": "svc"}))  # fmt: skip
    return spans


@pytest.mark.parametrize("shape", [_comb, _deep, _loop])
def test_finding_the_sides_costs_work_linear_in_the_spans(
    monkeypatch: pytest.MonkeyPatch, shape: Callable[[int], list[Span]]
) -> None:
    n = 1000
    spans = shape(n)
    monkeypatch.setattr(attribution, "TraceView", _CountingView)
    _CountingDict.looked = 0
    result = summarize_trace(spans)
    assert result.requests
    assert _CountingDict.looked <= 30 * len(spans), _CountingDict.looked
    for r in result.requests:
        _adds_up(r)
