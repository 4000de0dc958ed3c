"""The client-only adapter's requests are the outermost LLM client spans, as the walk up
(`TraceView.ancestors`) finds them, on parent ids that loop too.

Its remembered answers used to stop where a walk came back round a loop to the client
span it started from, and remember the spans on the way as having no client above: with
client span A and span B each other's parent and client span D under B, it gave A and
D, one request too many (D lies inside B, inside A).
"""

from __future__ import annotations

import random

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.conventions import genai_client
from tokentrace.analyzer.spans import KIND_CLIENT, KIND_INTERNAL, Span
from tokentrace.analyzer.trace_view import TraceView
from tokentrace.instrumentation import semconv as sc

from .spanfactory import MS, new_id

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
