"""Inter-token gap statistics from token times (ITL, TPOT, stalls)."""

from __future__ import annotations

from collections.abc import Sequence

from tokentrace.analyzer.summary import RequestSummary

#: A gap is a stall when it is longer than this many times the request's median
#: gap and longer than STALL_MIN_MS: the user sees the stream freeze.
STALL_FACTOR = 4.0
STALL_MIN_MS = 50.0


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Gives the q-quantile (linear interpolation) of already sorted values."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def stall_threshold_ms(median_gap_ms: float) -> float:
    """Gives the gap a stream's inter-token gap must exceed to be a stall."""
    return max(STALL_FACTOR * median_gap_ms, STALL_MIN_MS)


def apply_token_times(summary: RequestSummary, offsets_ms: Sequence[float]) -> None:
    """Fills ITL percentiles, max, stall count and the gap list from token times."""
    gaps = [b - a for a, b in zip(offsets_ms, offsets_ms[1:], strict=False)]
    summary.itl_gaps_ms = gaps
    if not gaps:
        return
    ordered = sorted(gaps)
    median = quantile(ordered, 0.5)
    summary.itl_p50_ms = median
    summary.itl_p95_ms = quantile(ordered, 0.95)
    summary.itl_p99_ms = quantile(ordered, 0.99)
    summary.itl_max_ms = ordered[-1]
    threshold = stall_threshold_ms(median)
    summary.stall_count = sum(1 for g in gaps if g > threshold)


def apply_tpot(summary: RequestSummary, *, decode_measured: bool = True) -> None:
    """Sets TPOT = decode / (output_tokens − 1), where there is more than one token and
    the decode was measured; else it stays None (not measured: a decode bucket of 0 that
    nothing measured is no TPOT of 0)."""
    n = summary.output_tokens
    if decode_measured and n is not None and n > 1:
        summary.tpot_ms = summary.decode_ms / (n - 1)
