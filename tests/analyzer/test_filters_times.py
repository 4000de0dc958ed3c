"""`--since` / `--until` ISO times in unix ns, exactly: integer arithmetic, nine digits.

They went through float seconds: `2025-10-09T08:53:20.000001Z` came out …001024 ns,
and a time written to the nanosecond was cut to the microsecond without a word.
"""

from __future__ import annotations

import pytest

from tokentrace.analyzer.report_cli import parse_when, window_bounds

T = 1_760_000_000 * 10**9  # 2025-10-09T08:53:20Z


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("2025-10-09T08:53:20Z", T),
        ("2025-10-09T08:53:20.000001Z", T + 1_000),
        ("2025-10-09T08:53:20.000000001Z", T + 1),
        ("2025-10-09T08:53:20.123456789Z", T + 123_456_789),
        ("2025-10-09T08:53:20.1234567Z", T + 123_456_700),
        ("2025-10-09T08:53:20.5", T + 500_000_000),  # no zone: UTC
        ("2025-10-09 08:53:20,25+00:00", T + 250_000_000),  # ISO's comma, a space for T
        ("2025-10-09T10:53:20.999999999+02:00", T + 999_999_999),
        ("2025-10-09", T - (8 * 3600 + 53 * 60 + 20) * 10**9),
        ("1969-12-31T23:59:59.999999999Z", -1),
    ],
)
def test_iso_times_are_exact_to_the_nanosecond(text: str, ns: int) -> None:
    assert parse_when(text, now_ns=0) == ns
    assert parse_when(text, now_ns=0, option="--until") == ns


def test_a_nanosecond_window_keeps_both_ends() -> None:
    assert window_bounds("2025-10-09T08:53:20.000000001Z", "2025-10-09T08:53:20.000000002Z", now_ns=T) == (
        T + 1, T + 2,
    )  # fmt: skip
    # one nanosecond apart the other way is an empty window, not two equal microseconds
    with pytest.raises(ValueError, match="is not after"):
        window_bounds("2025-10-09T08:53:20.000000002Z", "2025-10-09T08:53:20.000000001Z", now_ns=T)


def test_more_digits_than_nanoseconds_are_refused() -> None:
    with pytest.raises(ValueError, match=r"--until '2025-10-09T08:53:20.1234567891Z': at most 9 digits"):
        parse_when("2025-10-09T08:53:20.1234567891Z", now_ns=0, option="--until")


@pytest.mark.parametrize(("text", "ago_ns"), [("1.1s", 1_100_000_000), ("0.001s", 1_000_000), ("2.5m", 150 * 10**9)])
def test_fractional_durations_are_exact_too(text: str, ago_ns: int) -> None:
    assert parse_when(text, now_ns=T) == T - ago_ns
