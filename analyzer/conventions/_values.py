"""Reads the values senders put in span attributes, tolerantly: one reader for every adapter.

Senders differ: a float arrives as ``"0.25"``, a count as a float, a duration as
NaN, a Rust duration as ``"2m3s"``.  Nothing here raises.  A value that is no
number (absent, text, a list, a bool) gives None: not measured.  A number that
cannot be what it claims (NaN, ±inf, a negative duration, a duration beyond
2^63−1 ns) gives None too, and the reader remembers it in `flags`
(`impossible_value`), so the request is flagged rather than dropped
(docs/buckets.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from tokentrace.analyzer import summary as s

#: Durations and times are integer ns, stored (like byte counts) in signed 64-bit columns.
MAX_INT64 = 2**63 - 1
MAX_NS = MAX_INT64
_INF = float("inf")

#: One (number, unit) pair: Rust's `Duration` Debug ("12.3ms", "123.456µs"), the usual.
_PART = r"([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*(ns|µs|μs|us|ms|s|m|h)"
_DURATION = re.compile(_PART)
#: One or more pairs, maybe negative: the compound forms other senders write ("2m3s",
#: "1h2m3.5s").  Both are matched whole against the text with its blanks stripped
#: (`str.strip` strips what `\s` matches): blanks matched at the ends, beside the
#: sign's, left two runs of blanks side by side that a failing match split every way,
#: each split tried on the rest of the text, which is quadratic (a hostile attribute
#: stalled a decision for minutes).  Each run of blanks left lies between two things
#: that are no blanks, so a failing match gives each blank back once.
_COMPOUND = re.compile(rf"(-)?\s*((?:{_PART}\s*)+)")
_UNIT_NS = {"ns": 1, "µs": 1_000, "μs": 1_000, "us": 1_000, "ms": 1_000_000, "s": 10**9,
            "m": 60 * 10**9, "h": 3600 * 10**9}


def parse_number(value: object) -> int | float | None:
    """Gives an int or float attribute as it is, numeric text parsed; anything else None."""
    cls = value.__class__
    if cls is float or cls is int:
        return value  # type: ignore[return-value]
    if cls is str:
        try:
            return float(value)  # type: ignore[arg-type]  # strips blanks; "nan", "inf", "1e400" → non-finite
        except ValueError:
            return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value  # an int or float subclass (numpy scalars)
    return None


class ValueReader:
    """Reads one request's attribute values; `flags` says which flags what it read calls for."""

    __slots__ = ("flags",)

    def __init__(self) -> None:
        self.flags: list[str] = []

    def flag(self, flag: str) -> None:
        if flag not in self.flags:
            self.flags.append(flag)

    def number(self, value: object) -> float | None:
        """Gives a finite float; None when not a number, or not finite (flagged)."""
        n = parse_number(value)
        if n is None:
            return None
        try:
            f = float(n)
        except OverflowError:  # an int beyond any float
            f = _INF
        if -_INF < f < _INF:  # NaN fails the comparison too
            return f
        self.flag(s.FLAG_IMPOSSIBLE_VALUE)
        return None

    def count(self, value: object) -> int | None:
        """Gives a count (token or byte count) as an int; None when it is none.

        Its range is checked where it is stored (`drop_impossible_counts`): a count
        that is a number but not a finite one is impossible, flagged here.
        """
        if value.__class__ is int:
            return value  # type: ignore[return-value]
        n = parse_number(value)
        if n is None:
            return None
        if isinstance(n, int):
            return int(n)
        if math.isfinite(n):
            return int(n)
        self.flag(s.FLAG_IMPOSSIBLE_COUNT)
        return None

    def duration(self, ns: float) -> int | None:
        """Gives a duration in ns as an int; None (flagged) when negative, NaN or beyond MAX_NS."""
        if 0 <= ns <= MAX_NS:
            return round(ns)
        self.flag(s.FLAG_IMPOSSIBLE_VALUE)
        return None

    def seconds_ns(self, value: object) -> int | None:
        """Gives float seconds (vLLM, SGLang, GenAI attributes) as integer ns."""
        f = self.number(value)
        return None if f is None else self.duration(f * 1e9)

    def rust_duration_ns(self, value: object) -> int | None:
        """Gives a Rust `Duration` Debug string ("3.104512345s", "12.3ms", "123.456µs",
        "789ns"; also compound "2m3s") as ns; a bare number is seconds."""
        if value.__class__ is not str:
            return self.seconds_ns(value)
        text: str = value.strip()  # type: ignore[attr-defined]
        m = _DURATION.fullmatch(text)
        if m is not None:
            return self.duration(float(m.group(1)) * _UNIT_NS[m.group(2)])
        c = _COMPOUND.fullmatch(text)
        if c is None:
            return self.seconds_ns(value)  # "5": seconds; "abc", "": not measured
        ns = sum(float(n) * _UNIT_NS[unit] for n, unit in _DURATION.findall(c.group(2)))
        return self.duration(-ns if c.group(1) else ns)

    def times_ms(self, values: Sequence[object], scale: float) -> list[float]:
        """Gives token times (`values` × `scale` ms) in order; an element that is no
        finite time is left out, and times out of order are sorted (both flagged)."""
        try:  # the usual: numbers in order, read at the speed of a comprehension
            out = [v * scale for v in values]  # type: ignore[operator]
        except (TypeError, OverflowError):  # text, null, a list among them; an int beyond floats
            pass
        else:
            if not out or (
                out[0].__class__ is float
                and 0 <= out[0]
                and out[-1] < _INF
                and all(a <= b for a, b in zip(out, out[1:], strict=False))  # NaN fails it too
            ):
                return out
        out = []
        for v in values:
            f = self.number(v)
            if f is None or f < 0:
                self.flag(s.FLAG_IMPOSSIBLE_VALUE)
                continue
            out.append(f * scale)
        if any(b < a for a, b in zip(out, out[1:], strict=False)):
            self.flag(s.FLAG_IMPOSSIBLE_VALUE)
            out.sort()
        return out

    def time_ms(self, ms: float | None) -> float | None:
        """Gives a measured time (TTFT) in ms; None (flagged) when negative or not finite."""
        if ms is None or 0 <= ms < _INF:
            return ms
        self.flag(s.FLAG_IMPOSSIBLE_VALUE)
        return None

    def truth(self, value: object) -> bool:
        """Gives a boolean attribute: True, or text "true" / "1" (any case); else False."""
        if value is True:
            return True
        if value.__class__ is str:
            return value.strip().lower() in ("true", "1")  # type: ignore[attr-defined]
        n = parse_number(value)
        return n is not None and n == 1
