"""Receive → tail buffer → decide → commit → writer: the flow that wires the parts
together (docs/design.md §4).

`Pipeline.offer()` is what receivers call: it never blocks, and gives a refusal reason
when the buffer or the writer is full (`collector/refusals.py`), so the receiver can
answer 503 (gRPC UNAVAILABLE) with Retry-After *before* accepting what cannot be kept.
What it takes joins its trace in the tail buffer (`collector/trace_buffer.py`), or
follows the cached decision of a trace decided already (`collector/decision_cache.py`).

A decision thread ticks: it takes the traces that are ready (`collector/waits.py`),
decides each (`collector/deciding.py`: its request summaries, kept or not and why),
and commits the round (`collector/commit.py`): one write batch for the single writer,
the decisions into the cache, the counts (`collector/pipeline_stats.py`).

With the write-ahead log on (`collector/wal.py`), what `offer_logged` takes is appended
to the log in the same lock that puts it in the buffer, so the log's seqs follow the
buffer's order: the oldest pending trace, and the late spans not yet handed over, hold
the smallest seq still needed, which each round puts on its batch (`WriteBatch.wal_from`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import cast

from tokentrace.analyzer.spans import Span
from tokentrace.collector.arrivals import PACKED_TRACES, PLAIN_SPANS, Arrivals, Item
from tokentrace.collector.commit import Handover, RoundBatch
from tokentrace.collector.deciding import decide_trace
from tokentrace.collector.decision_cache import DecisionCache
from tokentrace.collector.decode_pool import limit_export_steps, note_dropped_steps
from tokentrace.collector.packed import PackedTrace
from tokentrace.collector.pipeline_stats import PipelineStats
from tokentrace.collector.refusals import (
    REFUSED_BUFFER_FULL,
    REFUSED_LAKE_BEHIND,
    REFUSED_WRITER_BEHIND,
    LakeGate,
    RefusalEpisodes,
    bound_reached,
    lake_unready,
    refusal_message,
    unready_reason,
)
from tokentrace.collector.sampling import Sampler
from tokentrace.collector.self_metrics import CollectorMetrics
from tokentrace.collector.settings import (
    DEFAULT_CLIENT_WAIT_S,
    DEFAULT_DECISION_CACHE_SIZE,
    DEFAULT_DECISION_TICK_S,
    DEFAULT_DECISION_WAIT_S,
    DEFAULT_GRACE_S,
    DEFAULT_MAX_BUFFERED_BYTES,
    DEFAULT_MAX_BUFFERED_SPANS,
    DEFAULT_SERVER_WAIT_S,
)
from tokentrace.collector.trace_buffer import PendingTrace, TraceBuffer
from tokentrace.collector.waits import DecisionWaits
from tokentrace.collector.wal import Durable, WriteAheadLog
from tokentrace.collector.writer import WriteBatch, Writer

logger = logging.getLogger("tokentrace.collector")


class Pipeline:
    """The tail-sampling pipeline; one per collector process."""

    def __init__(
        self,
        writer: Writer,
        sampler: Sampler,
        *,
        max_buffered_spans: int = DEFAULT_MAX_BUFFERED_SPANS,
        max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES,
        grace_s: float = DEFAULT_GRACE_S,
        server_wait_s: float = DEFAULT_SERVER_WAIT_S,
        client_wait_s: float = DEFAULT_CLIENT_WAIT_S,
        decision_wait_s: float = DEFAULT_DECISION_WAIT_S,
        decision_cache_size: int = DEFAULT_DECISION_CACHE_SIZE,
        tick_s: float = DEFAULT_DECISION_TICK_S,
        clock: Callable[[], int] = time.monotonic_ns,
        metrics: CollectorMetrics | None = None,
        wal: WriteAheadLog | None = None,
    ) -> None:
        #: the write-ahead log exports are appended to before they are acknowledged
        self.wal = wal
        #: the smallest log seq among the late spans not yet handed to the writer
        self._late_seq: int | None = None
        #: the last `wal_from` handed to the writer (a round that moves nothing writes none)
        self._wal_from_sent: int | None = None
        self._buffer = TraceBuffer(max_buffered_spans, max_buffered_bytes)
        self._writer = writer
        self._sampler = sampler
        self._tick_s = tick_s
        self._clock = clock
        self.stats = PipelineStats()
        self.metrics = metrics if metrics is not None else CollectorMetrics()
        self.metrics.watch_pipeline(self.stats)
        self.metrics.buffer_capacity.set(max_buffered_spans)
        self.metrics.buffer_capacity_bytes.set(max_buffered_bytes)
        self.metrics.watch_store(
            lambda: 1.0 if writer.store_writable else 0.0, lambda: writer.seconds_since_write
        )
        # guards the buffer, the waits and the cache: receiver threads and the decider
        self._lock = threading.Lock()
        self._waits = DecisionWaits(grace_s, server_wait_s, client_wait_s, decision_wait_s)
        self._cache = DecisionCache(decision_cache_size, self.stats)
        self._stop = threading.Event()
        self._handover = Handover(writer, self.stats, self._stop)
        # the ticker and a SIGTERM flush must not interleave their rounds
        self._decide_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: logs when the receivers start refusing exports and when they stop
        self.refusals = RefusalEpisodes(
            lambda why: bound_reached(why, writer, self._buffer, self.lake_gate)
        )
        #: a shard of a lake: refuses exports while too many rows wait for the lake
        self.lake_gate: LakeGate | None = None

    # ---- receive side ---------------------------------------------------------
    @property
    def buffered_spans(self) -> int:
        return self._buffer.spans

    @property
    def buffered_traces(self) -> int:
        return len(self._buffer.pending)

    @property
    def buffered_bytes(self) -> int:
        """What the buffered traces are reckoned to weigh (bounded by max_buffered_bytes)."""
        return self._buffer.bytes

    def add(self, spans: Sequence[Span]) -> bool:
        """Accepts spans into the buffer; gives False (nothing taken) when full.
        For `tokentrace import`, which waits for room: its refusals are not logged."""
        return self._receive(spans, PLAIN_SPANS) is None

    def offer(self, spans: Sequence[Span] | Sequence[PackedTrace]) -> str | None:
        """Accepts all the spans, or none and gives why (`refusals.REFUSED_*`).  Takes the
        `Span`s of one export, or the `PackedTrace`s of a decode worker.  What receivers
        call: the start and end of a run of refusals are logged (`refusals`), and the
        engine steps an export carries are bounded (`limit_export_steps`; a decode
        worker bounds its own)."""
        if spans and isinstance(spans[0], PackedTrace):
            why = self._receive(cast("Sequence[PackedTrace]", spans), PACKED_TRACES)
        else:
            plain = cast("Sequence[Span]", spans)
            dropped, service = limit_export_steps(plain)
            if dropped:
                note_dropped_steps(dropped, service)
            why = self._receive(plain, PLAIN_SPANS)
        self.refusals.note(why)
        return why

    def offer_logged(
        self, spans: Sequence[Span] | Sequence[PackedTrace], kind: int, payload: bytes
    ) -> tuple[str | None, Durable | None]:
        """`offer`, and the export's record (`kind`, `payload`: its body) appended to the
        write-ahead log with what it takes: gives why not, or the group commit that the
        receiver waits for before it acknowledges the export.  Without a log, `offer`."""
        if self.wal is None:
            return self.offer(spans), None
        if spans and isinstance(spans[0], PackedTrace):
            why, durable = self._receive_logged(
                cast("Sequence[PackedTrace]", spans), PACKED_TRACES, kind, payload
            )
        else:
            plain = cast("Sequence[Span]", spans)
            dropped, service = limit_export_steps(plain)
            if dropped:
                note_dropped_steps(dropped, service)
            why, durable = self._receive_logged(plain, PLAIN_SPANS, kind, payload)
        self.refusals.note(why)
        return why, durable

    def replay(self, spans: Sequence[Span], seq: int) -> str | None:
        """Takes the spans of a write-ahead-log record replayed at start, as record `seq`,
        their traces marked for a recheck (the store may hold them); gives why not."""
        limit_export_steps(spans)
        return self._receive(spans, PLAIN_SPANS, seq, replayed=True)

    def _receive_logged(
        self, items: Sequence[Item], arrivals: Arrivals[Item], kind: int, payload: bytes
    ) -> tuple[str | None, Durable | None]:
        record: list[Durable] = []
        why = self._receive(items, arrivals, record=(kind, payload, record))
        return why, (record[0] if record else None)

    def readiness(self) -> str | None:
        """Why receivers would refuse an export now (`/readyz`), None when ready."""
        wal = self.wal
        if wal is not None and wal.error is not None:
            return wal.error
        gate = self.lake_gate
        if gate is not None and gate.behind():
            return lake_unready(gate)
        return unready_reason(self._writer, self._buffer)

    def readiness_note(self) -> str | None:
        """What /readyz adds while ready: a shard's lake unreachable, within its bound."""
        gate = self.lake_gate
        return gate.condition() if gate is not None else None

    def refusal_message(self, why: str) -> str:
        """The message of a 503/UNAVAILABLE for the refusal reason `why`."""
        return refusal_message(why, self._writer.store_error)

    def _refusal(self, received: int, fresh: int, nbytes: int) -> str | None:
        """Counts what came in (`nbytes`: what it is reckoned to weigh); gives why it
        cannot be taken (lock held)."""
        stats = self.stats
        stats.spans_received += received
        writer = self._writer
        # while the store refuses writes, nothing more is taken: what is buffered
        # and queued waits for it, new exports are retried by their senders
        if writer.pending >= writer.capacity or writer.store_error is not None:
            stats.spans_rejected += received
            return REFUSED_WRITER_BEHIND
        if not self._buffer.has_room(fresh, nbytes):
            stats.spans_rejected += received
            return REFUSED_BUFFER_FULL
        gate = self.lake_gate
        if gate is not None and gate.behind():
            stats.spans_rejected += received
            return REFUSED_LAKE_BEHIND
        return None

    def _receive(
        self,
        items: Sequence[Item],
        arrivals: Arrivals[Item],
        seq: int = 0,
        replayed: bool = False,
        record: tuple[int, bytes, list[Durable]] | None = None,
    ) -> str | None:
        """Takes a batch of spans or packed traces whole, or gives why not.  `seq`: the
        write-ahead-log record they came in (a replay's); `record`: (kind, payload, out)
        to append them to the log as they are taken (the group commit put in `out`)."""
        now = self._clock()
        sizes = arrivals.weights(items)  # outside the lock
        with self._lock:
            cache = self._cache
            decided = cache.decided
            received = arrivals.span_count(items)
            fresh = arrivals.span_count(items, decided) if decided else received
            # (late spans of decided traces are reckoned in its bytes too: they are few)
            why = self._refusal(received, fresh, sum(sizes))
            if why is not None:
                return why
            if record is not None and self.wal is not None:
                # in the lock: the log's seqs follow the buffer's order
                kind, payload, out = record
                seq, durable = self.wal.append(kind, payload)
                out.append(durable)
            buffer = self._buffer
            pending = buffer.pending
            roots = self._waits.roots
            join = arrivals.join
            added = 0
            for item, nbytes in zip(items, sizes, strict=True):
                trace_id = item.trace_id
                p = pending.get(trace_id)
                new = p is None
                if p is None:
                    decision = decided.get(trace_id) if decided else None
                    if decision is not None:  # a late span: it follows the decision
                        if decision:
                            cache.keep_late(trace_id, arrivals.spans(item))
                            if seq and self._late_seq is None:
                                self._late_seq = seq
                        else:
                            cache.drop_late(arrivals.count(item))
                        continue
                    p = pending[trace_id] = PendingTrace([], now, wal_seq=seq, replayed=replayed)
                p.nbytes += nbytes
                added += nbytes
                for parent in join(p, item, new):
                    roots.append((now, trace_id, parent))
            buffer.spans += fresh
            buffer.bytes += added
            self.stats.spans_accepted += received
        return None

    def add_engine_data(self, batch: WriteBatch) -> bool:
        """Engine steps and GPU samples bypass sampling: they are kept whole.
        False (nothing taken) while the writer queue is full or the store fails."""
        taken = self._writer.store_error is None and self._writer.submit(batch)
        self.refusals.note(None if taken else REFUSED_WRITER_BEHIND)
        return taken

    def add_engine_data_logged(
        self, batch: WriteBatch, kind: int, payload: bytes
    ) -> tuple[bool, Durable | None]:
        """`add_engine_data`, and the export appended to the write-ahead log when taken:
        gives whether it was, and the group commit to wait for (None: no log)."""
        if self.wal is None:
            return self.add_engine_data(batch), None
        with self._lock:  # a round's `wal_from` then counts it queued before its batch
            taken = self._writer.store_error is None and self._writer.submit(batch)
            durable = self.wal.append(kind, payload)[1] if taken else None
        self.refusals.note(None if taken else REFUSED_WRITER_BEHIND)
        return taken, durable

    def _wal_from(self) -> int | None:
        """Gives the first log record still needed once what was handed to the writer so
        far is committed: the oldest pending trace's, the oldest late span's, else the
        next record's (the pipeline's lock held); None without a log."""
        wal = self.wal
        if wal is None:
            return None
        first = wal.next_seq
        oldest = self._buffer.oldest_wal_seq()
        if oldest is not None:
            first = min(first, oldest)
        if self._late_seq is not None:
            first = min(first, self._late_seq)
        return first

    # ---- decision side --------------------------------------------------------
    def decide_ready(self, force: bool = False) -> int:
        """Decides every trace that is ready (all of them when `force`); gives the count."""
        with self._decide_lock:
            return self._decide_ready(force)

    def _decide_ready(self, force: bool) -> int:
        now = self._clock()
        cache = self._cache
        with self._lock:
            if force:
                ready = self._waits.take_all(self._buffer)
            else:
                ready, evicted = self._waits.take_ready(now, self._buffer)
                self.stats.traces_evicted_early += evicted
            late = cache.take_late()
            self._late_seq = None
            wal_from = self._wal_from()
        batch = WriteBatch(late_spans=late)
        if late:
            batch.recheck.update(cache.rechecked_among(late))
        if not ready:
            if wal_from != self._wal_from_sent:  # rounds that decide nothing move it too
                batch.wal_from = self._wal_from_sent = wal_from
            if batch:
                self._handover.submit(batch)
            return 0
        horizon = cache.recheck_horizon(self._writer.stored_until_ns)
        round_batch = RoundBatch(batch, time.time_ns(), horizon, self.stats, self._handover.submit)
        latency = self.metrics.decision_latency
        for trace_id, p in ready:
            latency.observe((now - p.first_seen_ns) / 1e9)
            if trace_id in cache.decided:  # (only this thread changes it)
                # came back while its round was deciding it: late spans
                self._late_after_decision(trace_id, p.all_spans(), p.wal_seq)
                continue
            round_batch.add(trace_id, decide_trace(trace_id, p, self._sampler), p.replayed)
        with self._lock:
            cache.record(
                round_batch.decisions, round_batch.kept_ids, round_batch.round_start, batch.recheck
            )
            round_batch.count()
            # after the round's traces left the buffer (and any that came back while it
            # decided them went to the late spans): this batch holds what lies below it
            batch.wal_from = self._wal_from_sent = self._wal_from()
        if batch.requests:
            self.metrics.observe_requests(batch.requests)
        # Decisions must not be lost: wait for room in the writer queue (the
        # buffer then fills and receivers answer 503: backpressure, not loss).
        self._handover.submit(batch, len(ready))
        return len(ready)

    def _late_after_decision(self, trace_id: str, spans: Sequence[Span], seq: int = 0) -> None:
        """Sends the spans of a trace that came back to the buffer while an earlier round
        decided it (between that round's taking it and caching its decision) to that
        decision, as late spans: summarized again, it would be two requests."""
        with self._lock:
            if self._cache.get(trace_id):
                self._cache.keep_late(trace_id, spans)
                if seq and (self._late_seq is None or seq < self._late_seq):
                    self._late_seq = seq
            else:
                self._cache.drop_late(len(spans))

    def is_decided(self, trace_id: str) -> bool | None:
        """Gives the cached decision of a trace (True kept), None when not decided."""
        with self._lock:
            return self._cache.get(trace_id)

    def _loop(self) -> None:
        while not self._stop.wait(self._tick_s):
            try:
                self.decide_ready()
                if self.wal is not None:  # the segments the store no longer needs
                    self.wal.release(self._writer.wal_from)
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
        self._handover.log_lost_total()
