"""Deciding one trace: from its buffered spans (and the sampler) to its request summaries,
whether its spans are kept, and why.

Nothing here writes, counts or logs: the decision round (`collector/commit.py`) does that
with the outcome.  A trace whose spans a decode worker packed and summarized is decided
on the worker's summary, its spans left packed unless they are kept (or an attribute rule
must look at them).  A trace the analyzer or the sampler fails on is kept whole, with the
reason `unsummarized`, so that nothing accepted is lost and the round's other traces go on.

A trace that yields no request and no engine step is an engine's start-up (kept whole,
`engine_start`, with its `engine_starts` row) or matched no convention: then it is noted
(`unmatched_traces`, which the report's coverage names by root span) and sampled as any.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokentrace.analyzer.attribution import TraceResult, summarize_trace
from tokentrace.analyzer.engine_starts import EngineStart, recognize_start, root_of
from tokentrace.analyzer.spans import Span
from tokentrace.collector.sampling import Decision, Sampler
from tokentrace.collector.trace_buffer import PendingTrace
from tokentrace.collector.writer import UnmatchedTrace
from tokentrace.store.reasons import REASON_ENGINE_START, REASON_UNSUMMARIZED

#: The decision for a trace the analyzer or the sampler failed on.
UNSUMMARIZED_DECISION = Decision(True, REASON_UNSUMMARIZED, 1.0)
#: The decision for an engine's start-up trace: kept whole, whatever the sampler would say.
ENGINE_START_DECISION = Decision(True, REASON_ENGINE_START, 1.0)


@dataclass(slots=True)
class TraceOutcome:
    """What deciding one trace gives: its summary, and whether and why its spans are kept."""

    #: the trace's request summaries and engine steps
    result: TraceResult
    #: None for a trace that only carries engine steps: they are stored, its spans are not
    decision: Decision | None
    #: the trace's spans; None while they stay packed (a dropped trace's, unread)
    spans: list[Span] | None
    #: the ITL histogram counts of `result.requests`, where a decode worker made them
    itl_counts: list[list[int]] | None = None
    #: repeats of a span id dropped from the trace (an exporter's retry)
    duplicates: int = 0
    #: what the analyzer or the sampler raised (then the decision is UNSUMMARIZED_DECISION)
    failure: Exception | None = None
    #: the engine start-up the trace is (then the decision is ENGINE_START_DECISION)
    engine_start: EngineStart | None = None
    #: the trace's note where it yields nothing the analyzer knows
    unmatched: UnmatchedTrace | None = None


def decide_trace(trace_id: str, p: PendingTrace, sampler: Sampler) -> TraceOutcome:
    """Gives the outcome of the pending trace: summarized, and decided by the sampler."""
    packed = p.packed
    spans: list[Span] | None
    itl_counts: list[list[int]] | None = None
    duplicates = 0
    failure: Exception | None = None
    if packed is not None and packed.pre is not None and not p.spans:
        # only the spans one worker packed and summarized: its summary is this trace's
        result = packed.pre
        itl_counts = packed.itl_counts
        spans = p.all_spans() if sampler.rules else None
    else:
        duplicates = p.drop_repeats()
        spans = p.all_spans()
        try:
            result = summarize_trace(spans)
        except Exception as exc:  # one odd trace must not cost the round's other traces
            result, failure = TraceResult(), exc
    if result.engine_steps:
        if spans is None:
            spans = p.all_spans()
        if not result.requests and all(s.name == spans[0].name for s in spans):
            # a pure engine-step carrier trace: its data is stored, not its spans
            return TraceOutcome(result, None, spans, itl_counts, duplicates)
    unmatched: UnmatchedTrace | None = None
    if not result.requests and not result.engine_steps and failure is None:
        if spans is None:
            spans = p.all_spans()
        start = recognize_start(spans)
        if start is not None:
            return TraceOutcome(
                result, ENGINE_START_DECISION, spans, itl_counts, duplicates, engine_start=start
            )
        unmatched = unmatched_trace(spans)
    decision = UNSUMMARIZED_DECISION
    if failure is None:
        try:
            if spans is not None:
                decision = sampler.decide(trace_id, spans, result.requests)
            else:
                span_error = packed.error  # type: ignore[union-attr]
                decision = sampler.decide(trace_id, (), result.requests, span_error=span_error)
        except Exception as exc:  # the same: its spans are kept, marked
            failure = exc
    if decision.keep:
        spans = p.all_spans()
    return TraceOutcome(
        result, decision, spans, itl_counts, duplicates, failure, unmatched=unmatched
    )


def unmatched_trace(spans: Sequence[Span]) -> UnmatchedTrace | None:
    """Gives the note of a trace that yields nothing the analyzer knows (None: no spans)."""
    if not spans:
        return None
    root = root_of(spans)
    return UnmatchedTrace(
        trace_id=root.trace_id,
        start_ns=min(s.start_ns for s in spans),
        service=root.service_name,
        root_name=root.name,
        span_count=len(spans),
    )
