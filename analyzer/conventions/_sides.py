"""Which client span and which server span time a request (docs/design.md §2).

network = the client span's duration − the outermost server span's duration, and E is
the client span's duration.  The client span is the user's: the outermost CLIENT span
above the request's span, or LLM call span of any kind (`genai_client.is_llm_client`:
OpenInference's is INTERNAL, and the httpx CLIENT span under it ends when a stream's
response headers arrive).  The server's time is the outermost SERVER span between the
request's span and that client span: a proxy's, a gateway's, an HTTP server span around
the request; their time is queue (`other`).  The walk up for the server stops at the
client, because an app that is itself a web server has its own incoming SERVER span
above its outbound call: that span is the app's, never the LLM server's.

Only spans that are the request's own are taken: a span above two requests (one client
span around a retried call, an app's handler around two LLM calls, a request span around
another request) is neither one's, or each would claim the other's time.  Where no
client span is the request's own, its client is the nearest client span above it, as
it always was.  Where there is no client span at all, only SERVER spans of the request's
own service count: one of another service above, with no client span between, cannot be
placed (the wire to it was not traced), and the request's span stands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokentrace.analyzer.conventions import genai_client
from tokentrace.analyzer.conventions._common import inside_any
from tokentrace.analyzer.spans import KIND_CLIENT, KIND_SERVER, Span
from tokentrace.analyzer.trace_view import TraceView

#: the owner of a span above more than one request
_SHARED = -1


@dataclass(frozen=True, slots=True)
class Sides:
    """A request's client span (None: not traced) and the span that times its server
    side (None: the request's own span, or spans, do)."""

    client: Span | None
    server: Span | None

    def server_ns(self, own_ns: int) -> int:
        """Gives the server's time of a request whose own span (or spans) took `own_ns`:
        the outer server span's duration where it holds the request, else `own_ns`.

        An outer span shorter than the request cannot have held it: an HTTP server span
        that ends when a streamed answer's headers go out, before its body streams (an
        instrumentation that closes its span with the response future).  Its duration
        would cut the request's time short.  It is still the request's span (where E
        starts, its route, its status)."""
        if self.server is not None and self.server.duration_ns >= own_ns:
            return self.server.duration_ns
        return own_ns


class RequestSides:
    """Gives each request of a trace its `Sides`.

    `requests` holds each request's spans as its adapter found them (one span, or the
    disaggregated roots of one SGLang request).  Which request owns which span is worked
    out once, on the first question: each request's spans and their ancestors are
    marked with it, a span reached by two requests as shared.  A span's mark changes at
    most twice and a walk stops at a span it has marked or that is shared, so the
    marking costs the trace's spans once, loops of parent ids included; and as each
    span is one request's own at most, the walks up that answer the questions do too.
    """

    def __init__(self, trace: TraceView, requests: Sequence[Sequence[Span]]) -> None:
        self._trace = trace
        self._requests = requests
        self._index = {id(x): i for i, group in enumerate(requests) for x in group}
        self._owner: dict[str, int] | None = None

    def of(self, request: Span) -> Sides:
        """Gives the sides of the request whose span (its first, for several) is `request`."""
        trace = self._trace
        owner = self._owners()
        me = self._index[id(request)]
        service = request.service_name
        client: Span | None = None
        outer_server: Span | None = None  # the outermost of its own SERVER spans so far
        server_below_client: Span | None = None
        same_service_server: Span | None = None
        same_service = True  # no span of another service passed yet
        for above in trace.ancestors(request):
            if owner.get(above.span_id) != me:
                break  # from here up, the spans are shared (or no request's): not its own
            if above.kind == KIND_CLIENT or genai_client.is_llm_client(above):
                client, server_below_client = above, outer_server
            elif above.kind == KIND_SERVER:
                outer_server = above
            if same_service:
                if above.service_name != service:
                    same_service = False
                elif above.kind == KIND_SERVER:
                    same_service_server = above
        if client is not None:
            return Sides(client, server_below_client)
        # no client span of its own: the nearest one above, as the walk up finds it
        nearest = trace.client_span_of(request)
        if nearest is not None:
            return Sides(nearest, outer_server)
        return Sides(None, same_service_server)

    def _owners(self) -> dict[str, int]:
        if self._owner is not None:
            return self._owner
        owner: dict[str, int] = {}
        for i, group in enumerate(self._requests):
            for x in group:
                self._mark(owner, x, i)
        # an LLM call traced only on its client side is a request too: a span above it
        # and above a request is the two's (an app's handler that calls two backends)
        ours = set(self._index)
        inside = inside_any(self._trace, lambda x: id(x) in ours)
        n = len(self._requests)
        for c in genai_client.outer_clients(self._trace):
            if c.span_id not in owner and not inside(c):
                self._mark(owner, c, n)
                n += 1
        self._owner = owner
        return owner

    def _mark(self, owner: dict[str, int], span: Span, who: int) -> None:
        """Marks `span` and its ancestors as `who`'s, or as shared where another's."""
        by_id = self._trace.by_id
        x: Span | None = span
        while x is not None:
            was = owner.get(x.span_id)
            if was is None:
                owner[x.span_id] = who
            elif was == who or was == _SHARED:
                return  # walked by `who` before (a loop, or its other span), or shared above
            else:
                owner[x.span_id] = _SHARED
            x = by_id.get(x.parent_span_id)
