"""JSON responses of span data, which may hold NaN and ±Infinity (OTLP/JSON allows them as doubles)."""

from __future__ import annotations

import math
from typing import Any

from starlette.responses import JSONResponse

#: How a non-finite double is written: as the proto3 JSON mapping (OTLP/JSON) writes it.
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def finite(value: Any) -> Any:
    """Gives `value` with every NaN and ±Infinity float replaced by "NaN", "Infinity", "-Infinity"."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else _NON_FINITE[value]
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


class DataJSONResponse(JSONResponse):
    """A JSONResponse that writes non-finite floats as strings instead of failing with a 500.

    Strict JSON has no NaN; Starlette refuses it, and a browser's JSON.parse would too.
    The common case pays one json.dumps; only a document that holds one is walked.
    """

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except ValueError:
            return super().render(finite(content))
