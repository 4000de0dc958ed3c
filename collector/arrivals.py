"""The two forms an export reaches the tail buffer in, read through one interface, so that
one receive loop (`Pipeline.offer`) takes both: the `Span`s a receiver decoded, or the
`PackedTrace`s of a decode worker (`collector/packed.py` says why those stay packed)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Container, Sequence
from typing import Generic, TypeVar

from tokentrace.analyzer.spans import KIND_SERVER, Span
from tokentrace.collector.packed import PackedTrace
from tokentrace.collector.trace_buffer import PendingTrace, packed_bytes, spans_bytes

Item = TypeVar("Item", Span, PackedTrace)

_PARENTLESS = ("",)
_NONE: tuple[str, ...] = ()


class Arrivals(ABC, Generic[Item]):
    """What the receive loop asks of an item, a span or a packed trace."""

    @abstractmethod
    def weights(self, items: Sequence[Item]) -> list[int]:
        """Gives what each item is reckoned to weigh in the buffer."""

    @abstractmethod
    def span_count(self, items: Sequence[Item], decided: Container[str] = ()) -> int:
        """Gives how many spans the items hold, but for those of `decided` traces."""

    @abstractmethod
    def count(self, item: Item) -> int:
        """Gives how many spans the item holds."""

    @abstractmethod
    def spans(self, item: Item) -> Sequence[Span]:
        """Gives the item's spans (unpacked)."""

    @abstractmethod
    def join(self, p: PendingTrace, item: Item, new: bool) -> Sequence[str]:
        """Adds the item's spans to the pending trace (`new`: opened for this item); gives
        the parent span id ("" for none) of each of them that may be the trace's root: a
        parentless span, or a SERVER span (its parent may be a client's span that never
        comes)."""


class PlainSpans(Arrivals[Span]):
    def weights(self, items: Sequence[Span]) -> list[int]:
        return spans_bytes(items)

    def span_count(self, items: Sequence[Span], decided: Container[str] = ()) -> int:
        if not decided:
            return len(items)
        return sum(1 for s in items if s.trace_id not in decided)

    def count(self, item: Span) -> int:
        return 1

    def spans(self, item: Span) -> Sequence[Span]:
        return (item,)

    def join(self, p: PendingTrace, item: Span, new: bool) -> Sequence[str]:
        p.spans.append(item)
        parent = item.parent_span_id
        if not parent:
            return _PARENTLESS
        return (parent,) if item.kind == KIND_SERVER else _NONE


class PackedTraces(Arrivals[PackedTrace]):
    def weights(self, items: Sequence[PackedTrace]) -> list[int]:
        return [packed_bytes(t) for t in items]

    def span_count(self, items: Sequence[PackedTrace], decided: Container[str] = ()) -> int:
        if not decided:
            return sum(t.count for t in items)
        return sum(t.count for t in items if t.trace_id not in decided)

    def count(self, item: PackedTrace) -> int:
        return item.count

    def spans(self, item: PackedTrace) -> Sequence[Span]:
        return item.spans()

    def join(self, p: PendingTrace, item: PackedTrace, new: bool) -> Sequence[str]:
        if new:
            p.packed = item  # its spans stay packed until something needs them
        else:  # more spans of a buffered trace: the worker's summary no longer covers it
            p.spans.extend(item.spans())
        return item.roots  # the worker listed them


PLAIN_SPANS = PlainSpans()
PACKED_TRACES = PackedTraces()
