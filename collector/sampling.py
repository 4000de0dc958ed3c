"""Tail-sampling policies: which traces keep their whole span tree, and why.

Every decision records its reason (a named constant of store/reasons.py) and its weight (the
adjusted count, 1 / probability), as Refinery and OTel's `ot=th` do.  Policies,
first match wins: errors; configured SLOs; slowness above the running p99 of
the request's service/model/route over the last 5 to 10 minutes (TTFT, E2E,
each bucket, the largest inter-token gap); attribute rules; the warm-up of a
service/model/route (its first `min_samples` requests, before it has a p99);
a probabilistic baseline decided from the trace id.

The p99 is kept per `service.name` too, not only per model and route: two
deployments (staging and production, two regions, the demo's scenarios) often
serve the same model name, and one's slow tail then hid the other's outliers,
or the fast one's p99 made every request of the slow one an outlier.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from tokentrace.analyzer.spans import STATUS_ERROR, Span
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.collector.sketch import LatencySketch
from tokentrace.store.reasons import (
    P99_MEASURES,
    REASON_BASELINE,
    REASON_DROPPED,
    REASON_ERROR,
    REASON_P99_WARMUP,
    REASON_RULE,
    REASON_SLO,
)

#: 56 bits of randomness, as in W3C trace-context level 2 / OTel's `th`.
_RANDOM_BITS = 56
_RANDOM_MAX = 1 << _RANDOM_BITS

logger = logging.getLogger("tokentrace.collector")


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


#: Length of a p99 window, in seconds.  The threshold comes from the window
#: being filled plus the one before it, so it always rests on the last 5 to 10
#: minutes.  5 minutes is the window of the latency panels users compare with
#: (PromQL's `[5m]`; Jaeger's adaptive sampling and Refinery's EMA samplers
#: likewise follow the last minutes, not the process's life), short enough that
#: a change of the service (a deployment, a load step) sets a new normal within
#: 10 minutes, long enough that at 1 request/s a window holds 300 requests (3
#: above their p99).  A window closes
#: only once it holds `min_samples` requests, so a quiet key's window
#: stretches instead of judging against a handful of values.
P99_WINDOW_S = 300.0

#: (service, model, route) keys that get their own windows (only those seen in
#: the last window count); later ones share one.  A key costs 14 sketches (up
#: to ~16 KB each, for latencies spread over two orders of magnitude) and its
#: warm-up keeps up to `min_samples` traces: 256 keys stay under ~60 MB and
#: 25,600 warm-up traces, where the service and model names (the sender's
#: choice) could otherwise make both grow without end.
MAX_P99_KEYS = 256

#: Characters of each key part that count: a 15 MiB service name (which the
#: body limits allow) must not stay held by the tracker for a window after its
#: trace is gone.  Names that differ only beyond this share a key.
MAX_P99_KEY_CHARS = 256

#: What the running p99 is kept by: (service.name, model, route).
P99Key = tuple[str, str, str]


def p99_key(r: RequestSummary) -> P99Key:
    """Gives the key of the request's running p99: its service, model and route
    (each cut to `MAX_P99_KEY_CHARS`)."""
    n = MAX_P99_KEY_CHARS
    return (r.service[:n], r.model[:n], r.route[:n])


class _Windows:
    """One key's sketches, one per measure: the window being filled and the one before."""

    __slots__ = (
        "count", "current", "last_ns", "p99", "previous", "previous_count", "since", "start_ns",
    )  # fmt: skip

    def __init__(self, now_ns: int) -> None:
        n = len(P99_MEASURES)
        self.current = [LatencySketch(P99Tracker.ACCURACY) for _ in range(n)]
        self.previous = [LatencySketch(P99Tracker.ACCURACY) for _ in range(n)]
        self.p99: list[float | None] = [None] * n
        self.count = 0  # requests in the current window
        self.previous_count = 0  # requests in the previous one (0: still warming up)
        self.since = 0  # requests since the thresholds were read
        self.start_ns = now_ns  # when the current window opened
        self.last_ns = now_ns  # the last request

    def reset(self, now_ns: int) -> None:
        for sketch in (*self.current, *self.previous):
            sketch.clear()
        self.p99 = [None] * len(P99_MEASURES)
        self.count = self.previous_count = self.since = 0
        self.start_ns = now_ns

    def rotate(self, now_ns: int) -> None:
        self.previous, self.current = self.current, self.previous
        for sketch in self.current:
            sketch.clear()
        self.previous_count, self.count = self.count, 0
        self.start_ns = now_ns


class P99Tracker:
    """Running p99 per (service, model, route, measure) over the recent past, from
    DDSketches (1 % relative error).

    The key is the request's `service.name`, model and route (`p99_key`): the
    same model name served by two deployments (staging and production, two
    regions) is two normals, and one's tail must not hide the other's outliers.

    Each key has a window being filled and the one before it; its
    thresholds are read from both.  The current window closes once it is
    `window_s` old *and* holds `min_samples` requests: it becomes the previous
    one, the one before is forgotten, so a burst long past stops counting and
    a service that got slower sets a new normal within two windows.  A measure
    is judged once its two sketches hold `min_samples` values (before that the
    p99 is noise).

    Warm-up: the first `min_samples` requests of a key, before its first
    window closes, have no threshold to be judged against; `observe` gives
    `REASON_P99_WARMUP` for each of them (for the first `warmup` of them,
    when given), so a short first run is kept whole (at most `min_samples`
    traces per key).  A key with no request for a whole window starts over:
    its past says nothing about the next burst (a new deployment, a restarted
    load test, a cold start).

    The first `max_keys` keys seen within a window get their own windows;
    later ones share one (logged once), and keys silent for a window are
    forgotten.

    Reading a quantile walks the sketches' bins, so thresholds are cached and
    refreshed every `refresh` requests of the key and when a window closes:
    each request costs one clock read and one `add` per measure.
    """

    #: DDSketch's relative accuracy; a value is "above p99" only beyond twice
    #: this margin, so the sketch's own rounding never flags the top bucket.
    ACCURACY = 0.01

    def __init__(
        self,
        min_samples: int = 100,
        refresh: int = 32,
        window_s: float = P99_WINDOW_S,
        clock: Callable[[], int] = time.monotonic_ns,
        max_keys: int = MAX_P99_KEYS,
        warmup: int | None = None,
    ) -> None:
        if min_samples < 1 or refresh < 1 or window_s <= 0 or max_keys < 1:
            raise ValueError("min_samples, refresh, window_s and max_keys must be positive")
        if warmup is not None and warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        self.min_samples = min_samples
        self.refresh = refresh
        self.window_ns = int(window_s * 1e9)
        self.max_keys = max_keys
        #: how many of a warm-up's requests are kept (its first ones; None: all,
        #: 0: none, its requests only feed the sketches)
        self.warmup = min_samples if warmup is None else min(warmup, min_samples)
        self._clock = clock
        self._windows: dict[P99Key, _Windows] = {}
        self._overflow: _Windows | None = None  # the keys beyond `max_keys`
        #: requests judged on the shared p99 of the keys beyond `max_keys` (`/metrics`)
        self.shared_requests = 0
        self._swept_ns = clock()

    def p99(self, service: str, model: str, route: str, measure: str) -> float | None:
        """Gives the current p99 (None while the key's measure lacks `min_samples` values)."""
        n = MAX_P99_KEY_CHARS
        w = self._windows.get((service[:n], model[:n], route[:n]))
        if w is None:
            return None
        for i, (name, _) in enumerate(P99_MEASURES):
            if name == measure:
                return w.p99[i]
        return None

    def observe(self, r: RequestSummary) -> str | None:
        """Adds the request's measures; gives the p99 reason of the first one above
        p99, `REASON_P99_WARMUP` while its service/model/route warms up, else None."""
        now = self._clock()
        window_ns = self.window_ns
        if now - self._swept_ns >= window_ns:
            self._sweep(now)
        key = p99_key(r)
        w = self._windows.get(key)
        if w is None:
            w = self._open(key, now)
            if w is self._overflow:
                self.shared_requests += 1
        elif now - w.last_ns >= window_ns:
            w.reset(now)  # a whole window of silence
        elif w.count >= self.min_samples and now - w.start_ns >= window_ns:
            w.rotate(now)
            self._read(w)
        w.last_ns = now
        warming = not w.previous_count and w.count < self.min_samples
        keep_warm = warming and w.count < self.warmup
        reason: str | None = None
        thresholds = w.p99
        current = w.current
        for i, (measure, why) in enumerate(P99_MEASURES):
            value = getattr(r, measure)
            if value is None or value <= 0:
                continue
            if reason is None:
                threshold = thresholds[i]
                if threshold is not None and value > threshold:
                    reason = why
            current[i].add(value)
        w.count += 1
        w.since += 1
        if w.since >= self.refresh or (warming and w.count == self.min_samples):
            self._read(w)
        if keep_warm and reason is None:
            return REASON_P99_WARMUP
        return reason

    def _open(self, key: P99Key, now: int) -> _Windows:
        if len(self._windows) < self.max_keys:
            w = self._windows[key] = _Windows(now)
            return w
        if self._overflow is None:
            logger.warning(
                "tokentrace: more than %d (service, model, route) keys within %.0f s; "
                "later ones (first: %r) share one running p99 and warm-up",
                self.max_keys, self.window_ns / 1e9, key,
            )  # fmt: skip
            self._overflow = _Windows(now)
        return self._overflow

    def _read(self, w: _Windows) -> None:
        """Reads the thresholds of `w` from its two windows."""
        w.since = 0
        if w.count + w.previous_count < self.min_samples:
            return
        margin = 1 + 2 * self.ACCURACY
        p99 = w.p99
        for i, (current, previous) in enumerate(zip(w.current, w.previous, strict=True)):
            if current.count + previous.count >= self.min_samples:
                p99[i] = current.merged_quantile(previous, 0.99) * margin  # type: ignore[operator]
            else:
                p99[i] = None

    def _sweep(self, now: int) -> None:
        """Forgets the keys silent for a whole window (they would start over anyway)."""
        self._swept_ns = now
        window_ns = self.window_ns
        stale = [key for key, w in self._windows.items() if now - w.last_ns >= window_ns]
        for key in stale:
            del self._windows[key]


class Sampler:
    """Errors, SLO breaches, p99 outliers, rule matches and a service/model/route's
    warm-up are kept whole (weight 1); the rest by baseline (weight 1/baseline)."""

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
        warming = False
        for r in requests:
            why = self.p99.observe(r)
            if why == REASON_P99_WARMUP:
                warming = True
            elif slow is None:
                slow = why
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
        if warming:  # kept for sure, so weight 1 (before the baseline, whose weight is 1/p)
            return Decision(True, REASON_P99_WARMUP)
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
