"""Receive → trace buffer → decide → summarize → write (docs/design.md §4).

`Pipeline.offer()` is what receivers call: it never blocks and gives a refusal
reason when the buffer or the writer is full, so the receiver can answer 503
(gRPC UNAVAILABLE) with Retry-After *before* accepting what cannot be kept.

A decision thread ticks and decides, oldest first:
- traces whose root ended `grace` ago.  The root is the span without a parent,
  or a SERVER span whose parent is not in the trace (a `traceparent` from an
  uninstrumented client, or vLLM's `llm_request` under a gateway);
- traces rooted in an LLM client span whose server side has not come: `server_wait`
  after the root, or `grace` after the server's spans come.  The client and the
  server are two processes that export on their own schedules: tokentrace's SDK
  every 0.5 s, vLLM's (OpenTelemetry's default) every 5 s, so the user's client
  span often comes seconds before the engine's; decided at `grace`, the request
  would read as client-only and the engine's spans would come too late to count;
- traces rooted in a SERVER span whose parent (the client's span, from its
  `traceparent`) has not come: `client_wait` after the root, or `grace` after the
  parent comes.  The reverse of the above: a client that exports on
  OpenTelemetry's default schedule (every 5 s) sends its span after the server's,
  and decided at `grace` the request would lose its network and the user's TTFT;
- traces that waited `decision_wait` (their root never came);
- when the buffer passes its high-water mark, the oldest traces, early (counted).
It summarizes every request in them (kept or not), asks the sampler whether to
keep the span tree, and hands the result to the single writer.  Decisions are
cached so late spans follow them; a kept trace's span ids are cached with its
decision, so a late span already stored with it (an exporter's retry) is dropped.
A trace that may have been written beyond the cache's reach (before this process
opened the store, or so long ago that the cache forgot it) is marked for the writer
to check against the store (`collector/stored.py`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from tokentrace.analyzer.attribution import TraceResult, summarize_trace
from tokentrace.analyzer.conventions.genai_client import is_llm_client
from tokentrace.analyzer.spans import KIND_SERVER, Span
from tokentrace.analyzer.summary import FLAG_SERVER_UNSEEN, RequestSummary
from tokentrace.collector.decode_pool import limit_export_steps, note_dropped_steps
from tokentrace.collector.packed import PackedTrace
from tokentrace.collector.refusals import RefusalEpisodes
from tokentrace.collector.sampling import Decision, Sampler
from tokentrace.collector.self_metrics import CollectorMetrics
from tokentrace.collector.settings import DEFAULT_MAX_BUFFERED_BYTES
from tokentrace.collector.stored import RESEND_MARGIN_NS
from tokentrace.collector.writer import KeptTrace, WriteBatch, Writer
from tokentrace.store.reasons import REASON_UNSUMMARIZED

logger = logging.getLogger("tokentrace.collector")

#: Refusal reasons of `offer()` (also the `reason` label of rejected spans).
REFUSED_BUFFER_FULL = "buffer_full"
REFUSED_WRITER_BEHIND = "writer_behind"
#: How long the shutdown flush waits for room in the writer queue (the store
#: may be refusing writes): after it, what could not be queued is logged as lost.
CLOSE_WAIT_S = 30.0
#: Above this share of the bound the decider evicts the oldest traces early ...
HIGH_WATER = 0.9
#: ... until the buffer is back under this share.
LOW_WATER = 0.75
#: The most engine steps one write batch holds: a decision round whose traces carry
#: more (many step batch spans decided at once) hands them to the writer in parts.
MAX_BATCH_ENGINE_STEPS = 65_536

#: What a buffered span is reckoned to weigh beyond its strings (`_spans_bytes`): the
#: Span, its dicts and lists, ids, numbers.  ~1.2 KB a benchmark span all told.
SPAN_BYTES = 1024
#: ... an event or a link beyond its strings, an element of a list attribute, an
#: engine step or a request summary a decode worker made, and its token times.
EVENT_BYTES = 160
ELEMENT_BYTES = 32
STEP_BYTES = 300
REQUEST_BYTES = 2048
#: A string this long or longer counts 4 bytes a character unless it is ASCII (a
#: Python str of non-Latin-1 text takes 2 or 4 bytes a character).
_WIDE_CHECK_CHARS = 4096


#: The reason a trace is kept whose summary or decision failed (see `Pipeline._unsummarized`).
UNSUMMARIZED = REASON_UNSUMMARIZED
UNSUMMARIZED_DECISION = Decision(True, UNSUMMARIZED, 1.0)


@dataclass(slots=True)
class _Pending:
    spans: list[Span] = field(default_factory=list)
    first_seen_ns: int = 0
    #: the trace's first spans, still packed by a decode worker (they came
    #: before every span in `spans`)
    packed: PackedTrace | None = None
    #: what the trace is reckoned to weigh in memory (`_spans_bytes`, `_packed_bytes`)
    nbytes: int = 0

    def size(self) -> int:
        return len(self.spans) + (self.packed.count if self.packed is not None else 0)

    def all_spans(self) -> list[Span]:
        """Gives every span in arrival order, unpacking the packed ones (once)."""
        if self.packed is not None:
            self.spans = self.packed.spans() + self.spans
            self.packed = None
        return self.spans


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
    #: late spans of a kept trace whose span id was already stored with it
    late_duplicates_dropped: int = 0
    #: repeats of a span id within a buffered trace
    duplicate_spans_dropped: int = 0
    #: decided traces the writer checks against the store (`WriteBatch.recheck`)
    traces_rechecked: int = 0
    #: traces the analyzer or the sampler failed on: kept whole, unsummarized
    traces_unsummarized: int = 0
    requests_summarized: int = 0
    kept_by_reason: dict[str, int] = field(default_factory=dict)
    #: what decision rounds handed over after the writer thread had stopped: never
    #: written (`Pipeline._lost`); rows as the writer counts them (`WriteBatch.row_count`)
    batches_lost: int = 0
    traces_lost: int = 0
    rows_lost: int = 0


def _value_bytes(value: object) -> int:
    """What an attribute value weighs beyond SPAN_BYTES, about: a string or bytes its
    length (4 bytes a character for a long non-ASCII string), a list its elements."""
    if isinstance(value, str):
        n = len(value)
        return n if n < _WIDE_CHECK_CHARS or value.isascii() else 4 * n
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(ELEMENT_BYTES + _value_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(ELEMENT_BYTES + len(str(k)) + _value_bytes(v) for k, v in value.items())
    return 0  # a number, a bool, None: in SPAN_BYTES


def _attrs_bytes(attributes: dict[str, object]) -> int:
    n = 0
    for v in attributes.values():
        if v.__class__ is str and len(v) < _WIDE_CHECK_CHARS:  # type: ignore[arg-type]
            n += len(v)  # type: ignore[arg-type]
        elif v.__class__ is not int and v.__class__ is not float:
            n += _value_bytes(v)
    return n


def _extras_bytes(span: Span) -> int:
    """What a span's events and links weigh beyond SPAN_BYTES."""
    n = 0
    for e in span.events:
        n += EVENT_BYTES + len(e.name) + _attrs_bytes(e.attributes)
    for link in span.links:
        n += EVENT_BYTES + _attrs_bytes(link.attributes)
    return n


def _spans_bytes(spans: Sequence[Span]) -> list[int]:
    """What each span is reckoned to weigh in the buffer: SPAN_BYTES, its strings (name,
    status message, attribute values, events, links; a long non-ASCII string 4 bytes a
    character).  A resource and a scope name are counted with the first span of each
    object (the decoders give the spans of one resource one dict).  Attribute keys are
    not counted (a sender's few names).  ~0.2 us a benchmark span."""
    sizes = []
    resource: dict[str, object] | None = None
    scope: str | None = None
    for s in spans:
        n = SPAN_BYTES + len(s.name) + len(s.status_message)
        if s.attributes:
            n += _attrs_bytes(s.attributes)
        if s.events or s.links:
            n += _extras_bytes(s)
        if s.resource is not resource:
            resource = s.resource
            n += _attrs_bytes(resource)
        if s.scope is not scope:
            scope = s.scope
            n += len(scope)
        sizes.append(n)
    return sizes


def _packed_bytes(t: PackedTrace) -> int:
    """What a trace packed by a decode worker is reckoned to weigh: the pickled spans,
    and the summary the worker made (its token times, its engine steps)."""
    n = SPAN_BYTES // 4 * t.count + len(t.blob)
    pre = t.pre
    if pre is not None:
        n += STEP_BYTES * len(pre.engine_steps)
        for r in pre.requests:
            n += REQUEST_BYTES + ELEMENT_BYTES * len(r.itl_gaps_ms)
    return n


def _unique_spans(p: _Pending) -> int:
    """Drops the repeats of a span id from the trace (keeping the first); gives how
    many.  An exporter that lost the reply to an export sends it again (OTLP
    retries): summarized twice, its root would count as two requests."""
    spans = p.all_spans()
    if len({s.span_id for s in spans}) == len(spans):
        return 0
    seen: set[str] = set()
    unique = []
    for s in spans:
        if s.span_id not in seen:
            seen.add(s.span_id)
            unique.append(s)
    p.spans = unique
    return len(spans) - len(unique)


def _span_ids(spans: Sequence[Span]) -> bytearray:
    """Gives the span ids newline-delimited (with a newline at each end), the
    compact form `_late_is_new` searches: ~17 bytes a span, one object a trace."""
    return bytearray(("\n" + "\n".join([s.span_id for s in spans]) + "\n").encode())


def _late_is_new(ids: bytearray, span_id: str) -> bool:
    """Whether the span id is not yet in `ids`; adds it when it is not."""
    if f"\n{span_id}\n".encode() in ids:
        return False
    ids += f"{span_id}\n".encode()
    return True


def _trace_start(requests: Sequence[RequestSummary], spans: Sequence[Span] | None) -> int | None:
    """Gives when a decided trace started (unix ns): its first request, else its first
    kept span; None when it writes neither (a dropped trace with no request)."""
    if requests:
        return min([r.start_ns for r in requests])
    if spans:
        return min([s.start_ns for s in spans])
    return None


def _awaits_server(p: _Pending) -> bool:
    """Whether the trace holds an LLM client span with no SERVER span below it: a request
    whose server side has not come (yet, or ever: an uninstrumented server)."""
    packed = p.packed
    if packed is not None and packed.pre is not None:
        # the decode worker's summary says it, without unpacking the spans; spans
        # that came since are the server's when one of them is a SERVER span
        if any(s.kind == KIND_SERVER for s in p.spans):
            return False
        return any(FLAG_SERVER_UNSEEN in r.flags for r in packed.pre.requests)
    spans = p.all_spans()
    by_id = {s.span_id: s for s in spans}
    served: set[str] = set()  # spans with a SERVER span below them
    for s in spans:
        if s.kind == KIND_SERVER:
            parent = s.parent_span_id
            # each span marked once: linear, and a loop of parent ids ends at a marked one
            while parent and parent not in served and parent in by_id:
                served.add(parent)
                parent = by_id[parent].parent_span_id
    return any(s.span_id not in served and is_llm_client(s) for s in spans)


def _held_ids(p: _Pending) -> set[str]:
    """The span ids of the pending trace that a root candidate's parent may be among."""
    if p.packed is not None and not p.spans:
        # one worker's spans only, and it listed no root candidate whose parent
        # is among them
        return set()
    return {s.span_id for s in p.all_spans()}


class _Waiting:
    """Traces held past their grace for the other side of the request: (receive time
    of the root, trace id) in receive order, so the due ones are at the front, and
    the ids of those not decided yet (`Pipeline._take` removes them)."""

    __slots__ = ("ids", "queue", "wait_ns")

    def __init__(self, wait_s: float) -> None:
        self.wait_ns = int(wait_s * 1e9)
        self.queue: deque[tuple[int, str]] = deque()
        self.ids: set[str] = set()

    def add(self, received: int, trace_id: str) -> None:
        """Holds the trace from `received` on (a trace already held keeps its first time)."""
        if trace_id not in self.ids:
            self.queue.append((received, trace_id))
            self.ids.add(trace_id)

    def due(self, now: int) -> Iterator[str]:
        """Gives the held traces whose wait is over (each leaves the queue)."""
        queue, ids = self.queue, self.ids
        while queue and now - queue[0][0] >= self.wait_ns:
            trace_id = queue.popleft()[1]
            if trace_id in ids:  # (else decided already)
                yield trace_id


class Pipeline:
    """The tail-sampling pipeline; one per collector process."""

    def __init__(
        self,
        writer: Writer,
        sampler: Sampler,
        *,
        max_buffered_spans: int = 200_000,
        max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES,
        grace_s: float = 2.0,
        server_wait_s: float = 0.0,
        client_wait_s: float = 0.0,
        decision_wait_s: float = 30.0,
        decision_cache_size: int = 100_000,
        tick_s: float = 0.1,
        clock: Callable[[], int] = time.monotonic_ns,
        metrics: CollectorMetrics | None = None,
    ) -> None:
        if max_buffered_spans <= 0:
            raise ValueError("max_buffered_spans must be positive")
        if max_buffered_bytes <= 0:
            raise ValueError("max_buffered_bytes must be positive")
        self._writer = writer
        self._sampler = sampler
        self._max_spans = max_buffered_spans
        self._max_bytes = max_buffered_bytes
        self._grace_ns = int(grace_s * 1e9)
        self._wait_ns = int(decision_wait_s * 1e9)
        self._cache_size = decision_cache_size
        self._tick_s = tick_s
        self._clock = clock
        self.metrics = metrics if metrics is not None else CollectorMetrics()
        self.metrics.buffer_capacity.set(max_buffered_spans)
        self.metrics.buffer_capacity_bytes.set(max_buffered_bytes)
        self.metrics.watch_store(
            lambda: 1.0 if writer.store_writable else 0.0, lambda: writer.seconds_since_write
        )
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        # (receive time, trace id, parent span id or "" for a parentless root),
        # in receive order, so the ready ones are always at the front
        self._roots: deque[tuple[int, str, str]] = deque()
        #: traces rooted in an LLM client span waiting for their server side (`_awaits_server`)
        self._for_server = _Waiting(server_wait_s)
        #: traces rooted in a SERVER span waiting for its parent, the client's span
        self._for_client = _Waiting(client_wait_s)
        self._late: list[Span] = []
        self._buffered = 0
        #: what the buffered traces are reckoned to weigh (`_Pending.nbytes`)
        self._bytes = 0
        #: whether the last refusal for a full buffer was for its bytes (for the log)
        self._full_of_bytes = False
        self._decided: OrderedDict[str, bool] = OrderedDict()
        # span ids of the kept traces in `_decided` (late spans included), to
        # drop a late span stored already; only late spans ever look them up
        self._kept_span_ids: dict[str, bytearray] = {}
        # Beyond the cache's reach (`_recheck_horizon`): [traces, latest start] of each
        # decision round still in `_decided`, oldest first; the latest start of a trace
        # whose decision the cache forgot; the cached traces the writer rechecked
        self._rounds: deque[list[int]] = deque()
        self._forgotten_until_ns = 0
        self._rechecked: set[str] = set()
        self.stats = PipelineStats()
        self._stop = threading.Event()
        self._decide_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: logs when the receivers start refusing exports and when they stop
        self.refusals = RefusalEpisodes(self._bound_reached)

    # ---- receive side ---------------------------------------------------------
    @property
    def buffered_spans(self) -> int:
        return self._buffered

    @property
    def buffered_traces(self) -> int:
        return len(self._pending)

    @property
    def buffered_bytes(self) -> int:
        """What the buffered traces are reckoned to weigh (bounded by max_buffered_bytes)."""
        return self._bytes

    def add(self, spans: Sequence[Span]) -> bool:
        """Accepts spans into the buffer; gives False (nothing taken) when full.
        For `tokentrace import`, which waits for room: its refusals are not logged."""
        return self._offer(spans) is None

    def offer(self, spans: Sequence[Span] | Sequence[PackedTrace]) -> str | None:
        """Accepts all the spans, or none and gives why (`REFUSED_*`).  Takes the
        `Span`s of one export, or the `PackedTrace`s of a decode worker.  What receivers
        call: the start and end of a run of refusals are logged (`refusals`), and the
        engine steps an export carries are bounded (`limit_export_steps`; a decode
        worker bounds its own)."""
        if spans and not isinstance(spans[0], PackedTrace):
            dropped, service = limit_export_steps(spans)  # type: ignore[arg-type]
            if dropped:
                note_dropped_steps(dropped, service)
        why = self._offer(spans)
        self.refusals.note(why)
        return why

    def _offer(self, spans: Sequence[Span] | Sequence[PackedTrace]) -> str | None:
        if spans and isinstance(spans[0], PackedTrace):
            return self._offer_packed(spans)  # type: ignore[arg-type]
        return self._offer_spans(spans)  # type: ignore[arg-type]

    def readiness(self) -> str | None:
        """Why receivers would refuse an export now (`/readyz`), None when ready."""
        writer = self._writer
        error = writer.store_error
        if error is not None:
            return (
                f"store not writable for {writer.failing_for_seconds:.0f} s ({error}); "
                f"{writer.pending} batches waiting"
            )
        if writer.pending >= writer.capacity:
            return f"writer queue full ({writer.pending} of {writer.capacity} batches)"
        if self._buffered >= self._max_spans:
            return f"tail buffer full ({self._buffered} of {self._max_spans} spans)"
        if self._bytes >= self._max_bytes:
            return f"tail buffer full ({_mib(self._bytes)} of {_mib(self._max_bytes)} MiB)"
        return None

    def _bound_reached(self, why: str) -> str:
        """Names the bound behind the refusal reason `why`, with its figures (for the log)."""
        writer = self._writer
        if why == REFUSED_BUFFER_FULL:
            if self._full_of_bytes:
                return (
                    f"the tail buffer is full ({_mib(self._bytes)} MiB buffered in {self._buffered} "
                    f"spans, max_buffered_bytes {_mib(self._max_bytes)} MiB)"
                )
            return f"the tail buffer is full ({self._buffered} spans buffered, max_buffered_spans {self._max_spans})"
        error = writer.store_error
        if error is not None:
            return (
                f"the store takes no writes ({error}); {writer.pending} batches wait "
                f"(max_pending_writes {writer.capacity})"
            )
        return f"the writer queue is full ({writer.pending} batches, max_pending_writes {writer.capacity})"

    def refusal_message(self, why: str) -> str:
        """The message of a 503/UNAVAILABLE for the refusal reason `why`."""
        error = self._writer.store_error if why == REFUSED_WRITER_BEHIND else None
        text = why.replace("_", " ")
        if error is not None:
            text += f": the store takes no writes ({error})"
        return text + "; retry later"

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
        # an empty buffer takes any batch, so one big export always makes progress
        if self._buffered:
            over_bytes = self._bytes + nbytes > self._max_bytes
            if over_bytes or self._buffered + fresh > self._max_spans:
                self._full_of_bytes = over_bytes
                stats.spans_rejected += received
                return REFUSED_BUFFER_FULL
        return None

    def _offer_spans(self, spans: Sequence[Span]) -> str | None:
        now = self._clock()
        stats = self.stats
        sizes = _spans_bytes(spans)  # outside the lock
        with self._lock:
            decided = self._decided
            fresh = len(spans)
            if decided:
                fresh = sum(1 for s in spans if s.trace_id not in decided)
            # (late spans of decided traces are reckoned in too: they are few)
            why = self._refusal(len(spans), fresh, sum(sizes))
            if why is not None:
                return why
            added = 0
            before = stats.late_spans_dropped, stats.late_duplicates_dropped
            pending = self._pending
            roots = self._roots
            for s, nbytes in zip(spans, sizes, strict=True):
                trace_id = s.trace_id
                p = pending.get(trace_id)
                if p is None:
                    decision = decided.get(trace_id) if decided else None
                    if decision is not None:
                        if decision:
                            self._take_late(trace_id, (s,))
                        else:
                            stats.late_spans_dropped += 1
                        continue
                    p = pending[trace_id] = _Pending([], now)
                p.spans.append(s)
                p.nbytes += nbytes
                added += nbytes
                parent = s.parent_span_id
                if not parent:
                    roots.append((now, trace_id, ""))
                elif s.kind == KIND_SERVER:
                    roots.append((now, trace_id, parent))
            self._buffered += fresh
            self._bytes += added
            stats.spans_accepted += len(spans)
            late = fresh != len(spans)
            if late:
                not_kept = stats.late_spans_dropped - before[0]
                duplicates = stats.late_duplicates_dropped - before[1]
        if late:
            self._count_dropped_late(not_kept, duplicates)
        return None

    def _offer_packed(self, traces: Sequence[PackedTrace]) -> str | None:
        now = self._clock()
        stats = self.stats
        sizes = [_packed_bytes(t) for t in traces]  # outside the lock
        with self._lock:
            decided = self._decided
            received = sum(t.count for t in traces)
            fresh = received
            if decided:
                fresh = sum(t.count for t in traces if t.trace_id not in decided)
            why = self._refusal(received, fresh, sum(sizes))
            if why is not None:
                return why
            added = 0
            before = stats.late_spans_dropped, stats.late_duplicates_dropped
            pending = self._pending
            roots = self._roots
            for t, nbytes in zip(traces, sizes, strict=True):
                trace_id = t.trace_id
                p = pending.get(trace_id)
                if p is None:
                    decision = decided.get(trace_id) if decided else None
                    if decision is not None:
                        if decision:
                            self._take_late(trace_id, t.spans())
                        else:
                            stats.late_spans_dropped += t.count
                        continue
                    pending[trace_id] = _Pending([], now, t, nbytes)
                else:  # more spans of a buffered trace: the worker's summary no longer covers it
                    p.spans.extend(t.spans())
                    p.nbytes += nbytes
                added += nbytes
                for parent in t.roots:
                    roots.append((now, trace_id, parent))
            self._buffered += fresh
            self._bytes += added
            stats.spans_accepted += received
            late = fresh != received
            if late:
                not_kept = stats.late_spans_dropped - before[0]
                duplicates = stats.late_duplicates_dropped - before[1]
        if late:
            self._count_dropped_late(not_kept, duplicates)
        return None

    def _take_late(self, trace_id: str, spans: Sequence[Span]) -> None:
        """Queues the late spans of a kept trace for writing, but for those
        whose span id it holds already (lock held)."""
        ids = self._kept_span_ids.get(trace_id)
        stats = self.stats
        for s in spans:
            if ids is None or _late_is_new(ids, s.span_id):
                self._late.append(s)
                stats.late_spans_kept += 1
            else:
                stats.late_duplicates_dropped += 1

    def _count_dropped_late(self, not_kept: int, duplicates: int) -> None:
        """Adds dropped late spans to the self-metrics (outside the lock): those
        of traces not kept, and those a kept trace held already."""
        m = self.metrics
        if not_kept:
            m.late_spans.labels("false").inc(not_kept)
        if duplicates:
            m.duplicate_spans.labels("late").inc(duplicates)

    def add_engine_data(self, batch: WriteBatch) -> bool:
        """Engine steps and GPU samples bypass sampling: they are kept whole.
        False (nothing taken) while the writer queue is full or the store fails."""
        taken = self._writer.store_error is None and self._writer.submit(batch)
        self.refusals.note(None if taken else REFUSED_WRITER_BEHIND)
        return taken

    def _submit(self, batch: WriteBatch, traces: int = 0) -> None:
        """Hands a decided batch (of `traces` decided traces) to the writer, waiting for
        room (backpressure); at shutdown the wait is bounded (the store may refuse writes
        for good).  A writer whose thread stopped takes nothing: the batch is lost."""
        stopping = self._stop.is_set()
        if self._writer.submit_wait(batch, timeout=CLOSE_WAIT_S if stopping else None):
            return
        if self._writer.stopped:
            self._lost(batch, traces)
            return
        logger.error(
            "tokentrace: shutting down with the writer queue full (store: %s): "
            "%d request summaries, %d kept traces, %d late spans could not be queued",
            self._writer.store_error or "writable", len(batch.requests), len(batch.kept),
            len(batch.late_spans),
        )  # fmt: skip

    def _lost(self, batch: WriteBatch, traces: int) -> None:
        """Counts a decided batch the stopped writer thread will never write.  The first
        is logged with what it held; later ones are counted only (one round a tick would
        flood the log), and their total is logged at `close()`.  The episode lasts until
        the collector restarts: the thread does not come back.  Decide lock held."""
        stats = self.stats
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

    def _log_lost_total(self) -> None:
        """At close: the total of what was lost to a stopped writer thread, if anything."""
        stats = self.stats
        if stats.batches_lost:
            logger.error(
                "tokentrace: %d traces (%d rows) were decided after the DuckDB writer thread "
                "stopped and never written (%d batches)",
                stats.traces_lost, stats.rows_lost, stats.batches_lost,
            )  # fmt: skip

    # ---- decision side --------------------------------------------------------
    def _take(self, trace_id: str, out: list[tuple[str, _Pending]]) -> None:
        p = self._pending.pop(trace_id)
        self._for_server.ids.discard(trace_id)
        self._for_client.ids.discard(trace_id)
        self._buffered -= p.size()
        self._bytes -= p.nbytes
        out.append((trace_id, p))

    def _ready(self, now: int, force: bool) -> tuple[list[tuple[str, _Pending]], int]:
        ready: list[tuple[str, _Pending]] = []
        evicted = 0
        with self._lock:
            pending = self._pending
            if force:
                for trace_id in list(pending):
                    self._take(trace_id, ready)
                self._roots.clear()
                self._for_server.queue.clear()
                self._for_client.queue.clear()
                return ready, 0
            roots = self._roots
            grace = self._grace_ns
            for_server, for_client = self._for_server, self._for_client
            # the span ids of each trace looked into, once a round: a trace of n SERVER
            # spans has n root candidates, and each scanning its spans is n^2 under the lock
            held: dict[str, set[str]] = {}
            while roots and now - roots[0][0] >= grace:
                received, trace_id, parent = roots.popleft()
                p = pending.get(trace_id)
                if p is None:
                    continue  # decided already
                if parent:
                    ids = held.get(trace_id)
                    if ids is None:
                        ids = held[trace_id] = _held_ids(p)
                    if parent in ids and trace_id not in for_server.ids:
                        continue  # a SERVER span under a span we have: not the root
                    # (under the client span that waited for it: the server side came)
                    if parent not in ids and for_client.wait_ns > grace:
                        for_client.add(received, trace_id)
                        continue  # its parent may come: decided at client_wait, or
                        # at grace after the parent (a root of its own) comes
                elif for_server.wait_ns > grace and _awaits_server(p):
                    for_server.add(received, trace_id)
                    continue
                self._take(trace_id, ready)
            for waiting in (for_server, for_client):
                for trace_id in waiting.due(now):
                    self._take(trace_id, ready)
            wait = self._wait_ns
            while pending:
                trace_id, p = next(iter(pending.items()))
                if now - p.first_seen_ns < wait:
                    break
                self._take(trace_id, ready)
            # past the high-water mark of either bound: down to its low-water mark
            spans_high = self._buffered > self._max_spans * HIGH_WATER
            bytes_high = self._bytes > self._max_bytes * HIGH_WATER
            if spans_high or bytes_high:
                spans_low = self._max_spans * (LOW_WATER if spans_high else 1)
                bytes_low = self._max_bytes * (LOW_WATER if bytes_high else 1)
                while pending and (self._buffered > spans_low or self._bytes > bytes_low):
                    self._take(next(iter(pending)), ready)
                    evicted += 1
                self.stats.traces_evicted_early += evicted
        return ready, evicted

    def decide_ready(self, force: bool = False) -> int:
        """Decides every trace that is ready (all of them when `force`); gives the count."""
        with self._decide_lock:  # the ticker and a SIGTERM flush must not interleave
            return self._decide_ready(force)

    def _decide_ready(self, force: bool) -> int:
        now = self._clock()
        ready, evicted = self._ready(now, force)
        with self._lock:
            late, self._late = self._late, []
        m = self.metrics
        if evicted:
            m.traces_evicted.inc(evicted)
        if late:
            m.late_spans.labels("true").inc(len(late))
        batch = WriteBatch(late_spans=late)
        if late and self._rechecked:  # (the decider's own set)
            batch.recheck.update(s.trace_id for s in late if s.trace_id in self._rechecked)
        if not ready:
            if late:
                self._submit(batch)
            return 0
        wall = time.time_ns()
        horizon = self._recheck_horizon()
        round_start = 0
        outcomes: dict[tuple[bool, str], int] = {}
        decide = self._sampler.decide
        waits = m.decision_latency
        decisions: list[tuple[str, bool]] = []
        rules = bool(self._sampler.rules)
        duplicates = 0
        kept_ids: list[tuple[str, bytearray]] = []
        cached = self._decided  # (only this thread changes it)
        for trace_id, p in ready:
            waits.observe((now - p.first_seen_ns) / 1e9)
            if trace_id in cached:  # came back while its round was deciding it: late spans
                self._late_after_decision(trace_id, p.all_spans())
                continue
            forced: Decision | None = None
            packed = p.packed
            spans: list[Span] | None
            itl_counts: list[list[int]] | None = None
            if packed is not None and packed.pre is not None and not p.spans:
                # only the spans one worker packed and summarized: its summary is
                # this trace's, and the spans stay packed unless the trace is kept
                result = packed.pre
                itl_counts = packed.itl_counts
                spans = p.all_spans() if rules else None
            else:
                duplicates += _unique_spans(p)
                spans = p.all_spans()
                try:
                    result = summarize_trace(spans)
                except Exception:  # one odd trace must not cost the round's other traces
                    result, forced = TraceResult(), self._unsummarized(trace_id)
            if result.engine_steps:
                batch.engine_steps.extend(result.engine_steps)
                if len(batch.engine_steps) >= MAX_BATCH_ENGINE_STEPS:
                    # many step batches decided at once: written in parts, not as one batch
                    self._submit(WriteBatch(engine_steps=batch.engine_steps))
                    batch.engine_steps = []
                if spans is None:
                    spans = p.all_spans()
                if not result.requests and all(s.name == spans[0].name for s in spans):
                    # a pure engine-step carrier trace: its data is stored, not its spans
                    decisions.append((trace_id, False))
                    continue
            try:
                decision: Decision = forced or (
                    decide(trace_id, spans, result.requests)
                    if spans is not None
                    else decide(trace_id, (), result.requests, span_error=packed.error)  # type: ignore[union-attr]
                )
            except Exception:  # the same: its spans are kept, marked
                decision = self._unsummarized(trace_id)
            keep, reason, weight = decision.keep, decision.reason, decision.weight
            for r in result.requests:
                r.kept = keep
                r.sample_reason = reason
                r.sample_weight = weight
            batch.requests.extend(result.requests)
            batch.itl_counts.extend(itl_counts or [None] * len(result.requests))
            if keep:
                spans = p.all_spans()
                batch.kept.append(KeptTrace(trace_id, reason, weight, wall, spans))
                kept_ids.append((trace_id, _span_ids(spans)))
            start = _trace_start(result.requests, spans if keep else None)
            if start is not None:
                if start <= horizon:  # its first copy may be stored: the writer looks
                    batch.recheck.add(trace_id)
                round_start = max(round_start, start)
            outcomes[(keep, reason)] = outcomes.get((keep, reason), 0) + 1
            decisions.append((trace_id, keep))
        stats = self.stats
        with self._lock:
            cache, span_ids = self._decided, self._kept_span_ids
            for trace_id, keep in decisions:
                cache[trace_id] = keep
            span_ids.update(kept_ids)
            rounds = self._rounds
            if decisions:
                rounds.append([len(decisions), round_start])
            rechecked = self._rechecked
            rechecked |= batch.recheck
            while len(cache) > self._cache_size:
                trace_id, keep = cache.popitem(last=False)
                if keep:
                    span_ids.pop(trace_id, None)
                rechecked.discard(trace_id)
                oldest = rounds[0]  # the evicted trace's round
                self._forgotten_until_ns = max(self._forgotten_until_ns, oldest[1])
                oldest[0] -= 1
                if not oldest[0]:
                    rounds.popleft()
            stats.traces_rechecked += len(batch.recheck)
            stats.requests_summarized += len(batch.requests)
            stats.duplicate_spans_dropped += duplicates
            for (keep, reason), n in outcomes.items():
                stats.traces_decided += n
                if keep:
                    stats.traces_kept += n
                    stats.kept_by_reason[reason] = stats.kept_by_reason.get(reason, 0) + n
        for (keep, reason), n in outcomes.items():
            m.traces_decided.labels(str(keep).lower(), reason).inc(n)
        if batch.requests:
            m.requests_summarized.inc(len(batch.requests))
            m.observe_requests(batch.requests)
        if duplicates:
            m.duplicate_spans.labels("buffered").inc(duplicates)
        # Decisions must not be lost: wait for room in the writer queue (the
        # buffer then fills and receivers answer 503: backpressure, not loss).
        self._submit(batch, len(ready))
        return len(ready)

    def _recheck_horizon(self) -> int:
        """Gives the latest start (unix ns) a decided trace may have and still be a copy
        of one written beyond the decision cache's reach: before this process opened the
        store, or decided so long ago that the cache forgot it; -1 when there is none.
        A re-sent copy starts when its first copy did (within `RESEND_MARGIN_NS` for a
        part of a trace), so a trace that started later is new: only the few that
        started earlier cost the writer a look into the store (`collector/stored.py`)."""
        until = max(self._writer.stored_until_ns, self._forgotten_until_ns)
        return until + RESEND_MARGIN_NS if until else -1

    def _late_after_decision(self, trace_id: str, spans: Sequence[Span]) -> None:
        """Sends the spans of a trace that came back to the buffer while an earlier round
        decided it (between that round's taking it and caching its decision) to that
        decision, as late spans: summarized again, it would be two requests."""
        with self._lock:
            before = self.stats.late_spans_dropped, self.stats.late_duplicates_dropped
            if self._decided.get(trace_id):
                self._take_late(trace_id, spans)
            else:
                self.stats.late_spans_dropped += len(spans)
            not_kept = self.stats.late_spans_dropped - before[0]
            duplicates = self.stats.late_duplicates_dropped - before[1]
        self._count_dropped_late(not_kept, duplicates)

    def _unsummarized(self, trace_id: str) -> Decision:
        """Gives the decision for a trace the analyzer or the sampler failed on
        (logged): no summary, its spans kept whole with the reason `unsummarized`,
        so that nothing accepted is lost and the round's other traces are written."""
        stats = self.stats  # (the decide lock is held: the decider's own count)
        stats.traces_unsummarized += 1
        if stats.traces_unsummarized == 1:  # the first with its traceback; then counted
            logger.exception(
                "tokentrace: trace %s could not be summarized; its spans are kept whole "
                "(reason %s; further ones are counted in tokentrace_traces{reason=%r})",
                trace_id, UNSUMMARIZED, UNSUMMARIZED,
            )  # fmt: skip
        return UNSUMMARIZED_DECISION

    def is_decided(self, trace_id: str) -> bool | None:
        """Gives the cached decision of a trace (True kept), None when not decided."""
        with self._lock:
            return self._decided.get(trace_id)

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
        self._log_lost_total()


def _mib(nbytes: float) -> str:
    return f"{nbytes / (1024 * 1024):.0f}"
