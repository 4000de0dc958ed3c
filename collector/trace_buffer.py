"""The tail buffer: the traces not decided yet, what they weigh, and its bounds.

Receivers add to it (`Pipeline.offer`), the decider takes from it (`waits.DecisionWaits`).
Both bounds, spans and bytes, refuse an export that would pass them (`has_room`), and past
`HIGH_WATER` of either the oldest traces are decided early, down to `LOW_WATER`
(`overflow`).  What a span weighs is reckoned, not measured: its strings, plus a fixed
`SPAN_BYTES` for the `Span` object, its dicts and lists (docs/collector.md, "Memory").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from tokentrace.analyzer.spans import Span
from tokentrace.collector.packed import PackedTrace

#: Above this share of a bound the decider evicts the oldest traces early ...
HIGH_WATER = 0.9
#: ... until the buffer is back under this share.
LOW_WATER = 0.75

#: What a buffered span is reckoned to weigh beyond its strings (`spans_bytes`): the
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


@dataclass(slots=True)
class PendingTrace:
    """One buffered trace: its spans as they came, plain or still packed."""

    spans: list[Span] = field(default_factory=list)
    first_seen_ns: int = 0
    #: the trace's first spans, still packed by a decode worker (they came
    #: before every span in `spans`)
    packed: PackedTrace | None = None
    #: what the trace is reckoned to weigh in memory (`spans_bytes`, `packed_bytes`)
    nbytes: int = 0
    #: the write-ahead-log record that opened the trace (0: no log); the buffer holds its
    #: traces in the order of these seqs, so its oldest trace holds the smallest one
    wal_seq: int = 0
    #: replayed from the write-ahead log at start: the store may hold it already
    replayed: bool = False

    def size(self) -> int:
        return len(self.spans) + (self.packed.count if self.packed is not None else 0)

    def all_spans(self) -> list[Span]:
        """Gives every span in arrival order, unpacking the packed ones (once)."""
        if self.packed is not None:
            self.spans = self.packed.spans() + self.spans
            self.packed = None
        return self.spans

    def drop_repeats(self) -> int:
        """Gives how many repeats of a span id it dropped from the trace (keeping the first)."""
        # an exporter that lost the reply to an export sends it again (OTLP retries):
        # summarized twice, its root would count as two requests
        spans = self.all_spans()
        if len({s.span_id for s in spans}) == len(spans):
            return 0
        seen: set[str] = set()
        unique = []
        for s in spans:
            if s.span_id not in seen:
                seen.add(s.span_id)
                unique.append(s)
        self.spans = unique
        return len(spans) - len(unique)


class TraceBuffer:
    """The pending traces in arrival order, with the spans and bytes they hold.
    Not thread-safe: the pipeline's lock guards it."""

    __slots__ = ("bytes", "full_of_bytes", "max_bytes", "max_spans", "pending", "spans")

    def __init__(self, max_spans: int, max_bytes: int) -> None:
        if max_spans <= 0:
            raise ValueError("max_buffered_spans must be positive")
        if max_bytes <= 0:
            raise ValueError("max_buffered_bytes must be positive")
        self.max_spans = max_spans
        self.max_bytes = max_bytes
        self.pending: OrderedDict[str, PendingTrace] = OrderedDict()
        self.spans = 0
        #: what the pending traces are reckoned to weigh (`PendingTrace.nbytes`)
        self.bytes = 0
        #: whether the last refusal for a full buffer was for its bytes (for the log)
        self.full_of_bytes = False

    def has_room(self, spans: int, nbytes: int) -> bool:
        """Gives whether `spans` more spans weighing `nbytes` fit under both bounds."""
        if not self.spans:  # an empty buffer takes any batch: one big export always makes progress
            return True
        over_bytes = self.bytes + nbytes > self.max_bytes
        if over_bytes or self.spans + spans > self.max_spans:
            self.full_of_bytes = over_bytes
            return False
        return True

    def oldest_wal_seq(self) -> int | None:
        """Gives the write-ahead-log seq of the oldest pending trace (None: none pending)."""
        for p in self.pending.values():
            return p.wal_seq
        return None

    def take(self, trace_id: str) -> PendingTrace:
        """Gives the pending trace, no longer buffered."""
        p = self.pending.pop(trace_id)
        self.spans -= p.size()
        self.bytes -= p.nbytes
        return p

    def overflow(self) -> Iterator[str]:
        """Gives the oldest trace ids while the buffer is past the high-water mark of
        either bound, until it is under that bound's low-water mark; the caller takes
        each before asking for the next."""
        spans_high = self.spans > self.max_spans * HIGH_WATER
        bytes_high = self.bytes > self.max_bytes * HIGH_WATER
        if not (spans_high or bytes_high):
            return
        spans_low = self.max_spans * (LOW_WATER if spans_high else 1)
        bytes_low = self.max_bytes * (LOW_WATER if bytes_high else 1)
        while self.pending and (self.spans > spans_low or self.bytes > bytes_low):
            yield next(iter(self.pending))


def _value_bytes(value: object) -> int:
    """Gives what an attribute value weighs beyond SPAN_BYTES, about: a string or bytes
    its length (4 bytes a character for a long non-ASCII string), a list its elements."""
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
    """Gives what a span's events and links weigh beyond SPAN_BYTES."""
    n = 0
    for e in span.events:
        n += EVENT_BYTES + len(e.name) + _attrs_bytes(e.attributes)
    for link in span.links:
        n += EVENT_BYTES + _attrs_bytes(link.attributes)
    return n


def spans_bytes(spans: Sequence[Span]) -> list[int]:
    """Gives what each span is reckoned to weigh in the buffer: SPAN_BYTES and its strings
    (name, status message, attribute values, events, links).  ~0.2 us a benchmark span."""
    # a resource and a scope name count with the first span of each object (the decoders
    # give the spans of one resource one dict); attribute keys do not (a sender's few names)
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


def packed_bytes(t: PackedTrace) -> int:
    """Gives what a trace packed by a decode worker is reckoned to weigh: the pickled
    spans, and the summary the worker made (its token times, its engine steps)."""
    n = SPAN_BYTES // 4 * t.count + len(t.blob)
    pre = t.pre
    if pre is not None:
        n += STEP_BYTES * len(pre.engine_steps)
        for r in pre.requests:
            n += REQUEST_BYTES + ELEMENT_BYTES * len(r.itl_gaps_ms)
    return n
