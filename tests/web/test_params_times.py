"""The explorer's `since` / `until` in ISO 8601 are exact to the nanosecond, as the CLI's are:
through a float, `.000001Z` became …001024 ns and left out a request that started at …001000."""

from __future__ import annotations

import pytest

from tokentrace.web._params import ParamError, _time_ns


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("2025-10-09T08:53:20.000001Z", 1_760_000_000_000_001_000),
        ("2025-10-09T08:53:20.999999Z", 1_760_000_000_999_999_000),
        ("2025-10-09T10:53:20.000000001+02:00", 1_760_000_000_000_000_001),
        ("2025-10-09T08:53:20", 1_760_000_000_000_000_000),  # UTC unless it says otherwise
        ("1760000000000000123", 1_760_000_000_000_000_123),
    ],
)
def test_iso_times_are_exact(text: str, ns: int) -> None:
    assert _time_ns({"since": text}, "since") == ns


def test_a_bad_time_names_the_parameter() -> None:
    with pytest.raises(ParamError, match="since must be unix nanoseconds or an ISO 8601 time"):
        _time_ns({"since": "yesterday-ish"}, "since")
