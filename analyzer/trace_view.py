"""A trace's spans indexed for the adapters: by id, by parent, and the client side."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from tokentrace.analyzer.spans import KIND_CLIENT, Span

#: Tenant attribute keys, most specific first (DESIGN.md §3).
TENANT_KEYS = ("tokentrace.tenant", "tenant.id", "user.id", "enduser.id")
ENV_KEYS = ("deployment.environment.name", "deployment.environment")
INSTANCE_KEYS = ("service.instance.id", "process.pid", "vllm.process_id")


class TraceView:
    """The spans of one trace, with the look-ups every adapter needs."""

    def __init__(self, spans: Sequence[Span]) -> None:
        self.spans = spans
        self.by_id: dict[str, Span] = {s.span_id: s for s in spans}
        self.children: dict[str, list[Span]] = defaultdict(list)
        #: the spans summarized as requests, in order (each adapter's roots)
        self.summarized: list[Span] = []
        for s in spans:
            if s.parent_span_id:
                self.children[s.parent_span_id].append(s)

    def descendants(self, span: Span) -> Iterable[Span]:
        # a sender's parent ids may loop (a span its own parent): each span once
        seen = {span.span_id}
        stack = list(self.children.get(span.span_id, ()))
        while stack:
            s = stack.pop()
            if s.span_id in seen:
                continue
            seen.add(s.span_id)
            yield s
            stack.extend(self.children.get(s.span_id, ()))

    def ancestors(self, span: Span) -> Iterable[Span]:
        seen = {span.span_id}  # a loop back to `span` ends the walk: no span is its own ancestor
        parent = self.by_id.get(span.parent_span_id)
        while parent is not None and parent.span_id not in seen:
            seen.add(parent.span_id)
            yield parent
            parent = self.by_id.get(parent.parent_span_id)

    def client_span_of(self, server_span: Span) -> Span | None:
        """Gives the nearest CLIENT-kind ancestor: the user's side of this request."""
        for a in self.ancestors(server_span):
            if a.kind == KIND_CLIENT:
                return a
        return None

    def first_attr(self, keys: Sequence[str], spans: Iterable[Span], default: Any = "") -> Any:
        """Gives the first of `keys` found on `spans` (attributes, then resource)."""
        spans = list(spans)
        for key in keys:
            for s in spans:
                if key in s.attributes:
                    return s.attributes[key]
            for s in spans:
                if key in s.resource:
                    return s.resource[key]
        return default
