"""Rust `Duration` strings (TGI's timing attributes) are read in work linear in their length.

The regular expressions that read them matched blanks at the ends beside the sign's,
two runs of blanks side by side that a failing match split every way: a span attribute
of blanks around a digit (the security review: 0.8 s at 4,000 blanks, 144 s at 64,000)
stalled the collector's decision.  They are read as they were, the regular expressions
kept here as the oracle, only without the blowup.
"""

from __future__ import annotations

import random
import re

import pytest

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.conventions._values import ValueReader

from . import spanfactory as f
from .test_conventions_fuzz import TGI_DURATIONS

#: The regular expressions the reader read durations with: the oracle.
_PART = r"([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*(ns|µs|μs|us|ms|s|m|h)"
_DURATION = re.compile(rf"^\s*{_PART}\s*$")
_COMPOUND = re.compile(rf"^\s*(-)?\s*((?:{_PART}\s*)+)$")
_PARTS = re.compile(_PART)
_UNIT_NS = {"ns": 1, "µs": 1_000, "μs": 1_000, "us": 1_000, "ms": 1_000_000, "s": 10**9,
            "m": 60 * 10**9, "h": 3600 * 10**9}  # fmt: skip


def _oracle(value: object) -> tuple[int | None, list[str]]:
    rd = ValueReader()
    if value.__class__ is not str:
        return rd.seconds_ns(value), rd.flags
    m = _DURATION.match(value)  # type: ignore[arg-type]
    if m is not None:
        return rd.duration(float(m.group(1)) * _UNIT_NS[m.group(2)]), rd.flags
    c = _COMPOUND.match(value)  # type: ignore[arg-type]
    if c is None:
        return rd.seconds_ns(value), rd.flags
    ns = sum(float(n) * _UNIT_NS[unit] for n, unit in _PARTS.findall(c.group(2)))
    return rd.duration(-ns if c.group(1) else ns), rd.flags


def _read(value: object) -> tuple[int | None, list[str]]:
    rd = ValueReader()
    return rd.rust_duration_ns(value), rd.flags


def _rust_debug(ns: int) -> str:
    """Formats ns as Rust's `{:?}` of a `Duration` does: the largest unit the value
    reaches, the fraction's trailing zeros left out."""
    secs, nanos = divmod(ns, 10**9)
    if secs:
        whole, frac, width, unit = secs, nanos, 9, "s"
    elif nanos >= 1_000_000:
        whole, frac, width, unit = nanos // 1_000_000, nanos % 1_000_000, 6, "ms"
    elif nanos >= 1_000:
        whole, frac, width, unit = nanos // 1_000, nanos % 1_000, 3, "µs"
    else:
        return f"{nanos}ns"
    digits = str(frac).rjust(width, "0").rstrip("0")
    return f"{whole}.{digits}{unit}" if digits else f"{whole}{unit}"


def _real_values() -> list[object]:
    rng = random.Random(3)
    values: list[object] = list(TGI_DURATIONS)
    values += ["3.104512345s", "12.3ms", "123.456µs", "789ns", "123.456us", "2m", "1m 0.5s",
               "18446744073709551615.999999999s", "2562047h47m16.854775807s", "1h0m0s", "-1m30s",
               "0s", "1.s", "1.5E+3ms", "5\n", " 2m3s\t", "\u00a02ms\u2028", "1_000", " 0.25 "]  # fmt: skip
    for _ in range(500):
        ns = int(10 ** rng.uniform(0, 13))
        values.append(_rust_debug(ns))
        values.append(f.rust(ns / 1e6))  # the fixed-precision form the test traces carry
    return values


def test_real_durations_are_read_as_the_regular_expressions_read_them() -> None:
    for value in _real_values():
        assert _read(value) == _oracle(value), repr(value)


#: Pieces of durations and of things that are none, blanks of every kind among them.
PIECES = ("1", "0", "12", "3.5", ".", "e", "E", "-", "+", "e3", "ns", "µs", "μs", "us", "ms", "s",
          "m", "h", "n", "u", " ", "  ", "\t", "\n", "\u00a0", "\u2028", "\x1c", "\x85", "a",
          "٣", "_", "inf", "nan", "x")  # fmt: skip


def test_random_text_is_read_as_the_regular_expressions_read_it() -> None:
    rng = random.Random(9)
    for _ in range(30_000):
        value = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 9)))
        assert _read(value) == _oracle(value), repr(value)


BLANKS = 200_000  # the old expressions: about 24 minutes on the first of these
_B = " " * BLANKS


@pytest.mark.timeout(20)  # the regular expressions took minutes (quadratic); SRE answers SIGALRM
@pytest.mark.parametrize(
    ("value", "ns"),
    [
        (_B + "1" + _B + "s!", None),
        (_B, None),
        (_B + "x", None),
        ("\t" * BLANKS + "-" + "\u00a0" * BLANKS + "5" + "\u2028" * BLANKS + "ms" + _B + "?", None),
        ("1s " * BLANKS + "!", None),
        (_B + "200ms" + _B, 200_000_000),
        (_B + "2m" + _B + "3s" + _B, 123 * 10**9),
    ],
    ids=[
        "review",
        "blanks",
        "blanks_then_text",
        "every_blank",
        "many_parts",
        "padded",
        "padded_compound",
    ],
)
def test_a_long_run_of_blanks_is_read_in_linear_work(value: str, ns: int | None) -> None:
    assert _read(value) == (ns, [])


@pytest.mark.timeout(20)
def test_a_tgi_handler_with_a_hostile_duration_is_still_summarized() -> None:
    spans, _ = f.tgi_trace(1.0, 200.0, 100.0, 20.0, 10)
    spans[0].attributes["total_time"] = _B + "1" + _B + "s!"
    [got] = summarize_trace(spans).requests
    assert got.source == "tgi" and got.output_tokens == 10
