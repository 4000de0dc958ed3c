"""Committing decisions: one round's outcomes into a write batch, the batch to the
writer (waiting for room: backpressure, not loss), and what is lost when the writer
thread has stopped, counted and logged."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.collector.deciding import TraceOutcome
from tokentrace.collector.decision_cache import span_ids
from tokentrace.collector.pipeline_stats import PipelineStats
from tokentrace.collector.writer import KeptTrace, WriteBatch, Writer
from tokentrace.store.reasons import REASON_UNSUMMARIZED

logger = logging.getLogger("tokentrace.collector")

#: The most engine steps one write batch holds: a decision round whose traces carry
#: more (many step batch spans decided at once) hands them to the writer in parts.
MAX_BATCH_ENGINE_STEPS = 65_536
#: How long the shutdown flush waits for room in the writer queue (the store
#: may be refusing writes): after it, what could not be queued is logged as lost.
CLOSE_WAIT_S = 30.0


def trace_start(requests: Sequence[RequestSummary], spans: Sequence[Span] | None) -> int | None:
    """Gives when a decided trace started (unix ns): its first request, else its first
    kept span; None when it writes neither (a dropped trace with no request)."""
    if requests:
        return min([r.start_ns for r in requests])
    if spans:
        return min([s.start_ns for s in spans])
    return None


class RoundBatch:
    """The write batch of one decision round, built outcome by outcome, with what the
    decision cache and the counts need of it."""

    def __init__(
        self,
        batch: WriteBatch,
        wall_ns: int,
        horizon: int,
        stats: PipelineStats,
        submit: Callable[[WriteBatch], None],
    ) -> None:
        self.batch = batch
        self._wall_ns = wall_ns
        #: a trace that started by then may be stored already (`DecisionCache.recheck_horizon`)
        self._horizon = horizon
        self._stats = stats
        self._submit = submit
        #: (trace id, kept) of each trace decided, for the decision cache
        self.decisions: list[tuple[str, bool]] = []
        #: the span ids of each kept trace, for the decision cache
        self.kept_ids: list[tuple[str, bytearray]] = []
        #: the latest start among the round's traces
        self.round_start = 0
        self._outcomes: dict[tuple[bool, str], int] = {}
        self._duplicates = 0

    def add(self, trace_id: str, outcome: TraceOutcome, replayed: bool = False) -> None:
        """Adds one trace's outcome: its summaries and engine steps, its spans if kept.
        `replayed`: the trace came from the write-ahead log at start, so the store may
        hold it (decided after the log's checkpoint was committed): it is rechecked."""
        batch = self.batch
        result = outcome.result
        self._duplicates += outcome.duplicates
        if outcome.failure is not None:
            self._unsummarized(trace_id, outcome.failure)
        if result.engine_steps:
            batch.engine_steps.extend(result.engine_steps)
            # steps of a replayed trace may be stored already: the writer looks
            batch.replayed = batch.replayed or replayed
            if len(batch.engine_steps) >= MAX_BATCH_ENGINE_STEPS:
                # many step batches decided at once: written in parts, not as one batch
                self._submit(WriteBatch(engine_steps=batch.engine_steps, replayed=batch.replayed))
                batch.engine_steps = []
        decision = outcome.decision
        if decision is None:  # an engine-step carrier: nothing more to write
            self.decisions.append((trace_id, False))
            return
        keep, reason, weight = decision.keep, decision.reason, decision.weight
        if outcome.engine_start is not None:
            batch.engine_starts.append(outcome.engine_start)
        if outcome.unmatched is not None:
            batch.unmatched.append(outcome.unmatched)
        requests = result.requests
        for r in requests:
            r.kept = keep
            r.sample_reason = reason
            r.sample_weight = weight
        batch.requests.extend(requests)
        batch.itl_counts.extend(outcome.itl_counts or [None] * len(requests))
        spans = outcome.spans if keep else None
        if spans is not None:
            batch.kept.append(KeptTrace(trace_id, reason, weight, self._wall_ns, spans))
            self.kept_ids.append((trace_id, span_ids(spans)))
        start = trace_start(requests, spans)
        if start is None and outcome.unmatched is not None:  # dropped: only its note is written
            start = outcome.unmatched.start_ns
        if start is not None:
            if replayed or start <= self._horizon:  # its first copy may be stored: the writer looks
                batch.recheck.add(trace_id)
            self.round_start = max(self.round_start, start)
        self._outcomes[(keep, reason)] = self._outcomes.get((keep, reason), 0) + 1
        self.decisions.append((trace_id, keep))

    def count(self) -> None:
        """Adds the round to the pipeline's counts (the pipeline's lock held)."""
        stats, batch = self._stats, self.batch
        stats.traces_rechecked += len(batch.recheck)
        stats.requests_summarized += len(batch.requests)
        stats.duplicate_spans_dropped += self._duplicates
        decided = stats.decided
        for outcome, n in self._outcomes.items():
            decided[outcome] = decided.get(outcome, 0) + n

    def _unsummarized(self, trace_id: str, failure: Exception) -> None:
        """Counts a trace the analyzer or the sampler failed on; logs the first."""
        stats = self._stats  # (the decider's own count)
        stats.traces_unsummarized += 1
        if stats.traces_unsummarized == 1:  # the first with its traceback; then counted
            logger.error(
                "tokentrace: trace %s could not be summarized; its spans are kept whole "
                "(reason %s; further ones are counted in tokentrace_traces{reason=%r})",
                trace_id, REASON_UNSUMMARIZED, REASON_UNSUMMARIZED, exc_info=failure,
            )  # fmt: skip


class Handover:
    """Hands decided batches to the writer; counts and logs what a stopped writer
    thread will never write."""

    def __init__(self, writer: Writer, stats: PipelineStats, stopping: threading.Event) -> None:
        self._writer = writer
        self._stats = stats
        self._stopping = stopping

    def submit(self, batch: WriteBatch, traces: int = 0) -> None:
        """Hands a decided batch (of `traces` decided traces) to the writer, waiting for
        room; at shutdown the wait is bounded (the store may refuse writes for good).
        A writer whose thread stopped takes nothing: the batch is lost."""
        writer = self._writer
        stopping = self._stopping.is_set()
        if writer.submit_wait(batch, timeout=CLOSE_WAIT_S if stopping else None):
            return
        if writer.stopped:
            self._lost(batch, traces)
            return
        logger.error(
            "tokentrace: shutting down with the writer queue full (store: %s): "
            "%d request summaries, %d kept traces, %d late spans could not be queued",
            writer.store_error or "writable", len(batch.requests), len(batch.kept),
            len(batch.late_spans),
        )  # fmt: skip

    def _lost(self, batch: WriteBatch, traces: int) -> None:
        """Counts a decided batch the stopped writer thread will never write; logs the
        first with what it held (one a tick would flood the log; `log_lost_total` gives
        the total at close).  The thread does not come back until the collector restarts."""
        stats = self._stats
        first = stats.batches_lost == 0
        stats.batches_lost += 1
        stats.traces_lost += traces
        stats.rows_lost += batch.row_count()
        if first:
            logger.error(
                "tokentrace: decided data is lost while the DuckDB writer thread is stopped "
                "(%s): %d traces of this decision round (%d rows: %d request summaries, %d "
                "kept traces, %d late spans, %d engine steps) were not written; later losses "
                "are counted, and totalled at shutdown",
                self._writer.store_error, traces, batch.row_count(), len(batch.requests),
                len(batch.kept), len(batch.late_spans), len(batch.engine_steps),
            )  # fmt: skip

    def log_lost_total(self) -> None:
        """Logs the total of what was lost to a stopped writer thread, if anything."""
        stats = self._stats
        if stats.batches_lost:
            logger.error(
                "tokentrace: %d traces (%d rows) were decided after the DuckDB writer thread "
                "stopped and never written (%d batches)",
                stats.traces_lost, stats.rows_lost, stats.batches_lost,
            )  # fmt: skip
