"""One trace of an export as a decode worker hands it over: packed, not yet `Span` objects.

Most traces are sampled out, and for those the collector needs only the
trace's summary (computed by the worker), whether a span failed, and which
spans may be its root.  Their spans stay one pickled blob until something needs
them (the trace is kept, more of its spans arrive, an attribute rule looks at
them), so the GIL-bound collector process never builds ~95 % of the `Span`
objects.  Memory is about the same: a benchmark trace weighs ~6.3 KB packed
(the blob ~1.1 KB, the precomputed summary with its ITL gaps the rest)
against ~7.2 KB as `Span` objects.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

from tokentrace.analyzer.attribution import TraceResult
from tokentrace.analyzer.spans import Span


@dataclass(slots=True)
class PackedTrace:
    trace_id: str
    #: spans of the trace in this export
    count: int
    #: parent span id ("" for none) of each span that may be the trace's root:
    #: parentless spans and SERVER spans whose parent is not in this export
    roots: list[str]
    #: whether one of the spans has status ERROR
    error: bool
    #: pickled list of span field tuples, in `Span` field order
    blob: bytes
    #: `summarize_trace` of these spans (None when it failed in the worker)
    pre: TraceResult | None
    #: the ITL histogram counts of `pre.requests` (None: the writer computes them)
    itl_counts: list[list[int]] | None = None

    def spans(self) -> list[Span]:
        # the blob comes from our own worker process over a private pipe
        return [Span(*row) for row in pickle.loads(self.blob)]  # noqa: S301


def span_count(items: list[Span] | list[PackedTrace]) -> int:
    """Gives how many spans a list of spans or of packed traces holds."""
    if items and isinstance(items[0], PackedTrace):
        return sum(t.count for t in items)  # type: ignore[union-attr]
    return len(items)
