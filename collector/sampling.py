"""Tail-sampling policies: which traces keep their whole span tree, and why.

Every decision records its reason (a named constant) and its weight (the
adjusted count, 1 / probability), as Refinery and OTel's `ot=th` do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokentrace.analyzer.spans import STATUS_ERROR, Span
from tokentrace.analyzer.summary import RequestSummary

REASON_ERROR = "error"
REASON_SLO = "slo"
REASON_BASELINE = "baseline"
REASON_DROPPED = "dropped"

#: 56 bits of randomness, as in W3C trace-context level 2 / OTel's `th`.
_RANDOM_BITS = 56
_RANDOM_MAX = 1 << _RANDOM_BITS


@dataclass(frozen=True, slots=True)
class Decision:
    keep: bool
    reason: str
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class SloLimits:
    """Keep a trace whose request exceeds any of these (ms; None = no limit)."""

    ttft_ms: float | None = None
    e2e_ms: float | None = None
    itl_max_ms: float | None = None


def trace_randomness(trace_id: str) -> int:
    """Gives the trace id's 56 random bits (its rightmost 7 bytes)."""
    return int(trace_id[-14:], 16)


class Sampler:
    """Errors and SLO breaches are always kept; the rest by a baseline probability."""

    def __init__(self, baseline: float = 0.02, slo: SloLimits | None = None) -> None:
        if not 0.0 <= baseline <= 1.0:
            raise ValueError(f"baseline probability must be in [0, 1], got {baseline}")
        self.baseline = baseline
        self.slo = slo or SloLimits()
        # keep when randomness >= threshold (OTel consistent probability sampling)
        self._threshold = int(round((1.0 - baseline) * _RANDOM_MAX))

    def decide(
        self, trace_id: str, spans: Sequence[Span], requests: Sequence[RequestSummary]
    ) -> Decision:
        if any(s.status_code == STATUS_ERROR for s in spans) or any(r.error for r in requests):
            return Decision(True, REASON_ERROR)
        if any(self._breaches_slo(r) for r in requests):
            return Decision(True, REASON_SLO)
        if self.baseline > 0 and trace_randomness(trace_id) >= self._threshold:
            return Decision(True, REASON_BASELINE, 1.0 / self.baseline)
        return Decision(False, REASON_DROPPED)

    def _breaches_slo(self, r: RequestSummary) -> bool:
        slo = self.slo
        return bool(
            (slo.ttft_ms is not None and r.ttft_ms is not None and r.ttft_ms > slo.ttft_ms)
            or (slo.e2e_ms is not None and r.e2e_ms > slo.e2e_ms)
            or (slo.itl_max_ms is not None and r.itl_max_ms is not None and r.itl_max_ms > slo.itl_max_ms)
        )
