"""The span as the analyzer sees it: one convention-free record per OTLP span.

The collector decodes OTLP (protobuf or JSON) into these; the analyzer's
adapters read them.  Ids are lowercase hex strings, times are unix nanoseconds,
attribute values are plain Python values (str, bool, int, float, or lists).
The SDK's long lists (token times, engine steps) arrive packed as JSON strings
and stay so in storage; read them with `list_attr`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tokentrace.instrumentation.semconv import unpack_list

logger = logging.getLogger("tokentrace.analyzer")
_warned: set[str] = set()

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


def list_attr(attributes: Mapping[str, Any], key: str) -> list[Any]:
    """Gives the list attribute `key` carries, packed (a JSON string) or an OTLP array.

    Absent gives []; so does an unreadable value (a packed string cut short by
    an attribute length limit, say), with a warning once per attribute name.
    """
    value = attributes.get(key)
    if value is None:
        return []
    try:
        return unpack_list(value)
    except (ValueError, RecursionError) as exc:  # RecursionError: a list nested past Python's JSON depth
        if key not in _warned:
            _warned.add(key)
            logger.warning(
                "span attribute %s is unreadable and is ignored: %s (an attribute length "
                "limit such as OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT cuts packed lists short)",
                key,
                exc,
            )
        return []


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
    #: events the sender's SDK dropped past its limit (OTLP `dropped_events_count`): the
    #: OpenTelemetry SDK keeps 128 a span by default, and Python's, Go's and JS's drop the
    #: oldest, so `events` is then not the whole story (docs/conventions.md)
    dropped_events_count: int = 0

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
