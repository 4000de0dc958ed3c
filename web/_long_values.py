"""Span attribute lists too long to carry whole: summarized for the trace page and its JSON twin.

A request span may carry a million token offsets (`tokentrace.token.offsets_us`, packed as
one JSON string) and its client span as many chunk offsets: whole, they made the trace
page and `/api/trace/{id}` 11 MB each. A list of more than MAX_LIST_VALUES values is
summarized there — how many, the first and last few, and where all of them are (the
trace's OTLP JSON export, which keeps every value, as the database does).
"""

from __future__ import annotations

from typing import Any

from tokentrace.instrumentation import semconv as sc

#: Most values of one list attribute the trace view and its JSON twin carry whole.
MAX_LIST_VALUES = 1_000
#: How many of a longer list's first and last values its summary keeps.
LIST_ENDS = 5
#: Most characters of one of those values a summary keeps (a list of 100 KB texts)
ITEM_CHARS = 100


def otlp_export_path(trace_id: str) -> str:
    """Gives the path of the trace's OTLP JSON export, which holds every value of every span."""
    return f"/api/trace/{trace_id}/otlp.json"


class ListSummary(dict[str, Any]):
    """A list attribute too long to carry whole: `count`, its `first` and `last` LIST_ENDS
    values and `all_in` (the export that has them all). A dict, so JSON writes it as it is;
    its own type, so the page tells it from a map attribute a sender wrote."""

    def text(self) -> str:
        """Gives the summary in words: '1,000,000 values: [0, 20, …, 999980, 1000000]; every one is in …'."""
        first = ", ".join(str(v) for v in self["first"])
        last = ", ".join(str(v) for v in self["last"])
        return (
            f"{self['count']:,} values: [{first}, …, {last}]; "
            f"every one is in the trace's OTLP JSON export ({self['all_in']})"
        )


def _list_of(key: str, value: Any) -> list[Any] | None:
    """Gives the list `value` carries (an OTLP array, or one the SDK packs as a JSON string)."""
    if isinstance(value, list):
        return value
    # a packed list of more than MAX_LIST_VALUES values is longer than this: the shorter
    # strings are not parsed at all
    if key in sc.PACKED_LISTS and isinstance(value, str) and len(value) > 2 * MAX_LIST_VALUES:
        try:
            unpacked = sc.unpack_list(value)
        except (ValueError, RecursionError):
            return None  # unreadable (cut short by a length limit): shown as the text it is
        return unpacked
    return None


def _item(v: Any) -> Any:
    """Gives a list's item as a summary shows it: a text of at most ITEM_CHARS characters."""
    return v[:ITEM_CHARS] + "…" if isinstance(v, str) and len(v) > ITEM_CHARS else v


def bounded(key: str, value: Any, trace_id: str) -> Any:
    """Gives `value`, or its ListSummary when it is a list of more than MAX_LIST_VALUES values."""
    values = _list_of(key, value)
    if values is None or len(values) <= MAX_LIST_VALUES:
        return value
    return ListSummary(
        count=len(values),
        first=[_item(v) for v in values[:LIST_ENDS]],
        last=[_item(v) for v in values[-LIST_ENDS:]],
        all_in=otlp_export_path(trace_id),
    )


def bounded_attributes(attributes: dict[str, Any], trace_id: str) -> dict[str, Any]:
    """Gives `attributes` with each list of more than MAX_LIST_VALUES values summarized."""
    return {str(k): bounded(str(k), v, trace_id) for k, v in attributes.items()}
