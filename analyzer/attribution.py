"""Attribution: the spans of one trace in, its request summaries and engine steps out.

The collector calls `summarize_trace` at decision time; `tokentrace import`
goes through the same pipeline.  Nothing here knows how spans were received.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokentrace.analyzer.conventions import ADAPTERS, genai_client
from tokentrace.analyzer.engine_steps import EngineStep, extract_engine_steps
from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.analyzer.trace_view import TraceView

logger = logging.getLogger("tokentrace.analyzer")


@dataclass(slots=True)
class TraceResult:
    requests: list[RequestSummary] = field(default_factory=list)
    engine_steps: list[EngineStep] = field(default_factory=list)


def summarize_trace(spans: Sequence[Span]) -> TraceResult:
    """Gives the request summaries and engine steps found in one trace's spans.

    The first convention that finds requests wins.  Client-only requests
    (`genai_client`) are added beside a server-side winner's when they are calls
    of their own: an agent's trace may call one backend that traces its side and
    another that does not, and neither request may go missing.
    """
    result = TraceResult(engine_steps=extract_engine_steps(spans))
    if not spans:
        return result
    view = TraceView(spans)
    for name, adapter in ADAPTERS:
        view.summarized.clear()
        try:
            found = adapter(view)
        except Exception:  # one odd trace must not stop the pipeline
            logger.exception("adapter %s failed on trace %s", name, spans[0].trace_id)
            continue
        if found:
            result.requests = found
            if name != genai_client.NAME:
                try:
                    result.requests.extend(_calls_beside(view, list(view.summarized)))
                except Exception:
                    logger.exception("client-only calls beside trace %s failed", spans[0].trace_id)
            break
    return result


def _calls_beside(view: TraceView, served: list[Span]) -> list[RequestSummary]:
    """Gives the client-only requests that are none of the `served` requests' client side
    (`served`: the server-side requests' outermost spans)."""
    clients = genai_client.outer_clients(view)
    if not clients:
        return []
    # Each span is visited once however the requests nest (a chain of n requests
    # walked up and down from each would cost n^2/2: a hostile export's DoS).
    claimed: set[str] = set()
    for root in served:
        if root.span_id in claimed:  # an ancestor of a request seen already: checked above
            continue
        claimed.add(root.span_id)
        top, joined = root, False
        for above in view.ancestors(root):
            if above.span_id in claimed:  # the rest of the way up is claimed and checked
                joined = True
                break
            claimed.add(above.span_id)
            top = above
        if not joined and top.parent_span_id:
            # a lost span above the request: any client span may be its caller
            return []
    clients = [c for c in clients if c.span_id not in claimed]
    if clients:  # rarely: only then walk down (a client span inside a request is part of it)
        below: set[str] = set()
        stack = [c for root in served for c in view.children.get(root.span_id, ())]
        while stack:
            s = stack.pop()
            if s.span_id not in below:
                below.add(s.span_id)
                stack.extend(view.children.get(s.span_id, ()))
        claimed |= below
    return [genai_client.summarize_client(view, c) for c in clients if c.span_id not in claimed]
