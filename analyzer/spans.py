"""The span as the analyzer sees it: one convention-free record per OTLP span.

The collector decodes OTLP (protobuf or JSON) into these; the analyzer's
adapters read them.  Ids are lowercase hex strings, times are unix nanoseconds,
attribute values are plain Python values (str, bool, int, float, or lists).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# OTLP SpanKind enum values
KIND_UNSPECIFIED = 0
KIND_INTERNAL = 1
KIND_SERVER = 2
KIND_CLIENT = 3
KIND_PRODUCER = 4
KIND_CONSUMER = 5

# OTLP Status.code enum values
STATUS_UNSET = 0
STATUS_OK = 1
STATUS_ERROR = 2


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class SpanLink:
    trace_id: str
    span_id: str
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)
    status_code: int = STATUS_UNSET
    status_message: str = ""
    events: list[SpanEvent] = field(default_factory=list)
    links: list[SpanLink] = field(default_factory=list)
    scope: str = ""

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    @property
    def service_name(self) -> str:
        return str(self.resource.get("service.name", ""))

    @property
    def is_root(self) -> bool:
        return not self.parent_span_id

    def attr(self, key: str, default: Any = None) -> Any:
        """Gives the span's attribute, else its resource's, else `default`."""
        if key in self.attributes:
            return self.attributes[key]
        return self.resource.get(key, default)
