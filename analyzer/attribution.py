"""Attribution: the spans of one trace in, its request summaries and engine steps out.

The collector calls `summarize_trace` at decision time; `tokentrace import`
goes through the same pipeline.  Nothing here knows how spans were received.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokentrace.analyzer.conventions import ADAPTERS
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
    """Gives the request summaries and engine steps found in one trace's spans."""
    result = TraceResult(engine_steps=extract_engine_steps(spans))
    if not spans:
        return result
    view = TraceView(spans)
    for name, adapter in ADAPTERS:
        try:
            found = adapter(view)
        except Exception:  # one odd trace must not stop the pipeline
            logger.exception("adapter %s failed on trace %s", name, spans[0].trace_id)
            continue
        if found:
            result.requests = found
            break
    return result
