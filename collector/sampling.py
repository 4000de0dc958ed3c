"""Tail-sampling policies: which traces keep their whole span tree, and why.

Every decision records its reason (a named constant) and its weight (the
adjusted count, 1 / probability), as Refinery and OTel's `ot=th` do.  Policies,
first match wins: errors; configured SLOs; slowness above the running p99 of
the request's model/route (TTFT, E2E, each bucket, the largest inter-token
gap); attribute rules; a probabilistic baseline decided from the trace id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tokentrace.analyzer.spans import STATUS_ERROR, Span
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.collector.sketch import LatencySketch

REASON_ERROR = "error"
REASON_SLO = "slo"
REASON_RULE = "rule"
REASON_BASELINE = "baseline"
REASON_DROPPED = "dropped"
#: Kept because one measure was above the running p99 of its model/route.
REASON_P99_TTFT = "p99_ttft"
REASON_P99_E2E = "p99_e2e"
REASON_P99_QUEUE = "p99_queue"
REASON_P99_PREFILL = "p99_prefill"
REASON_P99_DECODE = "p99_decode"
REASON_P99_NETWORK = "p99_network"
REASON_P99_ITL = "p99_itl"

#: The request-summary field watched by each p99 reason.
P99_MEASURES: tuple[tuple[str, str], ...] = (
    ("ttft_ms", REASON_P99_TTFT),
    ("e2e_ms", REASON_P99_E2E),
    ("queue_ms", REASON_P99_QUEUE),
    ("prefill_ms", REASON_P99_PREFILL),
    ("decode_ms", REASON_P99_DECODE),
    ("network_ms", REASON_P99_NETWORK),
    ("itl_max_ms", REASON_P99_ITL),
)
ALL_REASONS: tuple[str, ...] = (
    REASON_ERROR, REASON_SLO, *(r for _, r in P99_MEASURES), REASON_RULE, REASON_BASELINE,
    REASON_DROPPED,
)  # fmt: skip

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


@dataclass(frozen=True, slots=True)
class AttributeRule:
    """Keep a trace where a span (or its resource) has `key` equal to `value`."""

    key: str
    value: str

    def matches(self, spans: Sequence[Span]) -> bool:
        for s in spans:
            found = s.attributes.get(self.key, s.resource.get(self.key))
            if found is not None and str(found) == self.value:
                return True
        return False


def parse_rules(text: str | Iterable[str] | None) -> tuple[AttributeRule, ...]:
    """Gives the rules of `key=value[,key=value…]`; ValueError for a malformed one."""
    if not text:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    rules = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"keep rule {item!r} must look like key=value")
        rules.append(AttributeRule(key.strip(), value.strip()))
    return tuple(rules)


def trace_randomness(trace_id: str) -> int:
    """Gives the trace id's 56 random bits (its rightmost 7 bytes)."""
    return int(trace_id[-14:], 16)


class P99Tracker:
    """Running p99 per (model, route, measure) from DDSketches (1 % relative error).

    Reading a quantile walks the sketch's bins, so each threshold is cached and
    refreshed every `refresh` additions; a measure is judged only once its
    sketch has `min_samples` values (before that the p99 is noise).
    """

    #: DDSketch's relative accuracy; a value is "above p99" only beyond twice
    #: this margin, so the sketch's own rounding never flags the top bucket.
    ACCURACY = 0.01

    def __init__(self, min_samples: int = 100, refresh: int = 32) -> None:
        self.min_samples = min_samples
        self.refresh = refresh
        self._sketches: dict[tuple[str, str, str], LatencySketch] = {}
        self._p99: dict[tuple[str, str, str], float] = {}
        self._since: dict[tuple[str, str, str], int] = {}
        # (model, route) -> one key per measure, so a request builds no tuples
        self._keys: dict[tuple[str, str], tuple[tuple[str, str, str], ...]] = {}

    def p99(self, model: str, route: str, measure: str) -> float | None:
        """Gives the current p99 (None until `min_samples` values were seen)."""
        return self._p99.get((model, route, measure))

    def observe(self, r: RequestSummary) -> str | None:
        """Adds the request's measures; gives the p99 reason of the first one above p99."""
        reason: str | None = None
        keys = self._keys.get((r.model, r.route))
        if keys is None:
            keys = self._keys[(r.model, r.route)] = tuple(
                (r.model, r.route, measure) for measure, _ in P99_MEASURES
            )
        p99 = self._p99
        sketches = self._sketches
        since = self._since
        for (measure, why), key in zip(P99_MEASURES, keys, strict=True):
            value = getattr(r, measure)
            if value is None or value <= 0:
                continue
            if reason is None:
                threshold = p99.get(key)
                if threshold is not None and value > threshold:
                    reason = why
            sketch = sketches.get(key)
            if sketch is None:
                sketch = sketches[key] = LatencySketch(self.ACCURACY)
                since[key] = 0
            sketch.add(value)
            n = since[key] + 1
            if n >= self.refresh and sketch.count >= self.min_samples:
                p99[key] = sketch.quantile(0.99) * (1 + 2 * self.ACCURACY)  # type: ignore[operator]
                n = 0
            since[key] = n
        return reason


class Sampler:
    """Errors, SLO breaches, p99 outliers and rule matches are kept whole; the rest by baseline."""

    def __init__(
        self,
        baseline: float = 0.02,
        slo: SloLimits | None = None,
        rules: Sequence[AttributeRule] = (),
        p99: P99Tracker | None = None,
    ) -> None:
        if not 0.0 <= baseline <= 1.0:
            raise ValueError(f"baseline probability must be in [0, 1], got {baseline}")
        self.baseline = baseline
        self.slo = slo or SloLimits()
        self.rules = tuple(rules)
        self.p99 = p99 if p99 is not None else P99Tracker()
        # keep when randomness >= threshold (OTel consistent probability sampling)
        self._threshold = int(round((1.0 - baseline) * _RANDOM_MAX))

    def decide(
        self,
        trace_id: str,
        spans: Sequence[Span],
        requests: Sequence[RequestSummary],
        *,
        span_error: bool | None = None,
    ) -> Decision:
        """Decides whether to keep the trace.  `span_error`, when given, says
        whether one of its spans failed, for a caller that has not unpacked
        the spans (then `spans` may be empty unless attribute rules are set)."""
        # every request feeds the sketches, whatever the decision
        slow = None
        for r in requests:
            why = self.p99.observe(r)
            slow = slow or why
        if span_error is None:
            span_error = any(s.status_code == STATUS_ERROR for s in spans)
        if span_error or any(r.error for r in requests):
            return Decision(True, REASON_ERROR)
        if any(self._breaches_slo(r) for r in requests):
            return Decision(True, REASON_SLO)
        if slow is not None:
            return Decision(True, slow)
        if self.rules and any(rule.matches(spans) for rule in self.rules):
            return Decision(True, REASON_RULE)
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
