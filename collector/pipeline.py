"""Receive → trace buffer → decide → summarize → write (DESIGN.md §4).

`Pipeline.add()` is what receivers call: it never blocks and answers False
when the buffer is full, so the receiver can answer 503 with Retry-After.
A decision thread ticks, finds traces whose root ended more than `grace` ago
(or that have waited `decision_wait`), summarizes every request in them (kept
or not), asks the sampler whether to keep the span tree, and hands the result
to the single writer.  Decisions are cached so late spans follow them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import Span
from tokentrace.collector.sampling import Decision, Sampler
from tokentrace.collector.writer import KeptTrace, WriteBatch, Writer

logger = logging.getLogger("tokentrace.collector")


@dataclass(slots=True)
class _Pending:
    spans: list[Span] = field(default_factory=list)
    first_seen_ns: int = 0
    root_end_ns: int | None = None  # receive time at which a root span arrived


@dataclass(slots=True)
class PipelineStats:
    spans_received: int = 0
    spans_accepted: int = 0
    spans_rejected: int = 0
    traces_decided: int = 0
    traces_kept: int = 0
    traces_evicted_early: int = 0
    late_spans_kept: int = 0
    late_spans_dropped: int = 0
    requests_summarized: int = 0
    kept_by_reason: dict[str, int] = field(default_factory=dict)


class Pipeline:
    """The tail-sampling pipeline; one per collector process."""

    def __init__(
        self,
        writer: Writer,
        sampler: Sampler,
        *,
        max_buffered_spans: int = 200_000,
        grace_s: float = 2.0,
        decision_wait_s: float = 30.0,
        decision_cache_size: int = 100_000,
        tick_s: float = 0.1,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        if max_buffered_spans <= 0:
            raise ValueError("max_buffered_spans must be positive")
        self._writer = writer
        self._sampler = sampler
        self._max_spans = max_buffered_spans
        self._grace_ns = int(grace_s * 1e9)
        self._wait_ns = int(decision_wait_s * 1e9)
        self._cache_size = decision_cache_size
        self._tick_s = tick_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._buffered = 0
        self._decided: OrderedDict[str, bool] = OrderedDict()
        self.stats = PipelineStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- receive side ---------------------------------------------------------
    @property
    def buffered_spans(self) -> int:
        return self._buffered

    def add(self, spans: Sequence[Span]) -> bool:
        """Accepts spans into the buffer; gives False (nothing taken) when full."""
        now = self._clock()
        with self._lock:
            self.stats.spans_received += len(spans)
            fresh = sum(1 for s in spans if s.trace_id not in self._decided)
            if self._buffered + fresh > self._max_spans:
                self.stats.spans_rejected += len(spans)
                return False
            late: list[Span] = []
            for s in spans:
                decision = self._decided.get(s.trace_id)
                if decision is not None:
                    if decision:
                        late.append(s)
                        self.stats.late_spans_kept += 1
                    else:
                        self.stats.late_spans_dropped += 1
                    continue
                p = self._pending.get(s.trace_id)
                if p is None:
                    p = self._pending[s.trace_id] = _Pending(first_seen_ns=now)
                p.spans.append(s)
                if not s.parent_span_id:
                    p.root_end_ns = now
            self._buffered += fresh
            self.stats.spans_accepted += len(spans)
        if late:
            self._writer.submit_wait(WriteBatch(late_spans=late), timeout=5)
        return True

    def add_engine_data(self, batch: WriteBatch) -> bool:
        """Engine steps and GPU samples bypass sampling: they are kept whole."""
        return self._writer.submit(batch)

    # ---- decision side --------------------------------------------------------
    def _ready(self, now: int, force: bool) -> list[tuple[str, _Pending]]:
        ready: list[tuple[str, _Pending]] = []
        with self._lock:
            for trace_id, p in list(self._pending.items()):
                root_done = p.root_end_ns is not None and now - p.root_end_ns >= self._grace_ns
                if force or root_done or now - p.first_seen_ns >= self._wait_ns:
                    ready.append((trace_id, p))
                    del self._pending[trace_id]
                    self._buffered -= len(p.spans)
        return ready

    def decide_ready(self, force: bool = False) -> int:
        """Decides every trace that is ready (all of them when `force`); gives the count."""
        now = self._clock()
        ready = self._ready(now, force)
        if not ready:
            return 0
        batch = WriteBatch()
        wall = time.time_ns()
        for trace_id, p in ready:
            result = summarize_trace(p.spans)
            batch.engine_steps.extend(result.engine_steps)
            if not result.requests and result.engine_steps and all(
                s.name == p.spans[0].name for s in p.spans
            ):
                # a pure engine-step carrier trace: its data is stored, not its spans
                self._remember(trace_id, False)
                continue
            decision: Decision = self._sampler.decide(trace_id, p.spans, result.requests)
            for r in result.requests:
                r.kept = decision.keep
                r.sample_reason = decision.reason
                r.sample_weight = decision.weight
            batch.requests.extend(result.requests)
            self.stats.requests_summarized += len(result.requests)
            if decision.keep:
                batch.kept.append(
                    KeptTrace(trace_id, decision.reason, decision.weight, wall, p.spans)
                )
                self.stats.traces_kept += 1
                self.stats.kept_by_reason[decision.reason] = (
                    self.stats.kept_by_reason.get(decision.reason, 0) + 1
                )
            self._remember(trace_id, decision.keep)
            self.stats.traces_decided += 1
        # Decisions must not be lost: wait for room in the writer queue.
        self._writer.submit_wait(batch)
        return len(ready)

    def _remember(self, trace_id: str, keep: bool) -> None:
        with self._lock:
            self._decided[trace_id] = keep
            while len(self._decided) > self._cache_size:
                self._decided.popitem(last=False)

    def _loop(self) -> None:
        while not self._stop.wait(self._tick_s):
            try:
                self.decide_ready()
            except Exception:
                logger.exception("tokentrace: decision round failed")

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="tokentrace-decider", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        """Decides everything still buffered and flushes it (SIGTERM path)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self.decide_ready(force=True)
        self._writer.flush()
