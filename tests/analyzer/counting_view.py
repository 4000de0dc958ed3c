"""A TraceView that counts its parent and children look-ups: the analyzer's walks must stay
linear in a trace's spans on hostile input (loops, combs, deep chains)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tokentrace.analyzer.trace_view import TraceView


class CountingDict(dict):  # type: ignore[type-arg]
    looked = 0

    def get(self, key: Any, default: Any = None) -> Any:
        CountingDict.looked += 1
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        CountingDict.looked += 1
        return super().__getitem__(key)


class _CountingChildren(defaultdict):  # type: ignore[type-arg]
    def get(self, key: Any, default: Any = None) -> Any:
        CountingDict.looked += 1
        return super().get(key, default)


class CountingView(TraceView):
    """A TraceView whose parent and children look-ups are counted."""

    def __init__(self, spans: Any) -> None:
        super().__init__(spans)
        self.by_id = CountingDict(self.by_id)
        self.children = _CountingChildren(list, self.children)
