"""What every diagnosis signal shares: the window, its baseline numbers, the finding record.

A signal module exposes ``COMPLAINT`` and ``detect(ctx: Context) -> Finding |
None``.  Thresholds are relative (shares and ratios against a baseline from
the same window) with a small absolute floor, so they hold on real, noisy
traffic and not only on synthetic shapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import duckdb

from tokentrace._words import counted
from tokentrace.analyzer import queries
from tokentrace.analyzer.filters import Filters

#: Fewer requests than this in a window: no statistics worth a finding.
MIN_REQUESTS = 30
MAX_AFFECTED = 1000
MAX_EXAMPLES = 5
#: Kept traces a finding offers as examples; `diagnose` shows MAX_EXAMPLES of them,
#: preferring traces no higher-ranked finding shows already.
MAX_EXAMPLE_CANDIDATES = 50
#: Time slices per window for the per-slice signals (arrival rate, load).
TARGET_SLICES = 60
MIN_SLICE_NS = 1_000_000_000
#: Most rows the window may have counted per time slice, tenant and class (`Context.slice_mix`,
#: slices × tenants × classes) for one pass: past it (tenants by the hundred, one per end user)
#: each signal runs its own query.
MAX_SLICE_MIX_ROWS = 20_000
NICE_SLICE_SECONDS = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)

#: What to fix first, per complaint (docs/design.md §5).  Where a signal knows which cause
#: fired, its finding leads with that cause's fix (`Finding.fix_lead`) and this follows.
FIX_FIRST: dict[str, str] = {
    "tiny_prompts_slow": "Check the serving region against your users, kill cross-region hops, cap queue depth.",
    "bad_in_production": "Separate production traffic, scale earlier, tighten concurrency limits.",
    "long_wait_then_fast": "Shrink prompts, cap RAG context, reduce prefill batching.",
    "stutter": "Reduce decode batching, separate long and short requests.",
    "peak_hours": "Lower the batch delay where the server waits to fill batches, add priority queues, scale up faster.",
    "big_tenants_slower": "Isolate tenants (per-tenant queues or limits), split background jobs off.",
    "batch_mode_breaks_live": "Use batch mode only where humans are not waiting; give live traffic its own queue.",
    "cold_start": "Warm instances before they take traffic (load weights, run a dummy request), keep a minimum of warm replicas.",
    "gpu_saturation": "Add GPU capacity or cut work per request (shorter outputs, smaller model, quantization).",
    "kv_cache_pressure": "Give the KV cache more memory (gpu memory utilization, fewer max sequences), cap context length.",
}

TITLES: dict[str, str] = {
    "tiny_prompts_slow": "It's slow even for tiny prompts",
    "bad_in_production": "It feels fine locally but bad in production",
    "long_wait_then_fast": "Nothing happens for a while, then it answers fast",
    "stutter": "It starts responding, then freezes or stutters",
    "peak_hours": "Latency explodes at peak hours",
    "big_tenants_slower": "Big customers feel slower than small ones",
    "batch_mode_breaks_live": "Cheaper batch mode works, live mode feels broken",
    "cold_start": "First requests after start, deploy or idle are slow",
    "gpu_saturation": "The GPU is saturated",
    "kv_cache_pressure": "KV-cache memory is under pressure",
}


class Affected(list[str]):
    """A finding's affected trace ids, worst first (the first MAX_AFFECTED), and `total`:
    how many requests it speaks of in all."""

    total: int = 0


@dataclass(slots=True)
class Finding:
    complaint: str
    confidence: float
    #: share of the window's end-to-end time (0..1) the problem touches: ranks findings
    impact: float
    evidence: list[dict[str, Any]]
    affected_trace_ids: list[str] = field(default_factory=list)
    #: how many requests the finding speaks of in all (`affected_trace_ids` holds the first
    #: MAX_AFFECTED traces); None: as many as the list
    affected_count: int | None = None
    #: kept traces, best first: up to MAX_EXAMPLE_CANDIDATES until `pick_examples`
    example_traces: list[str] = field(default_factory=list)
    #: the fix for the cause the signal saw (a sentence), said before the complaint's generic fix
    fix_lead: str | None = None
    #: what follows the lead in place of the complaint's generic fix, where the signal measured
    #: which of its advice applies ("": none of it does); None: FIX_FIRST's, whole
    fix_then: str | None = None
    #: the title where the finding's shape contradicts the complaint's (a server saturated
    #: throughout has no peak hours); None: TITLES'.  The complaint id stays the same.
    title: str | None = None
    #: which comparison the finding rests on, where a signal has more than one (peak_hours:
    #: "contrast" or "saturated"; stutter: decode_batch.BASIS): `diagnose`
    #: uses it to tell one queue's story once.  Not part of the report.
    basis: str | None = None

    @property
    def score(self) -> float:
        # low-impact findings (cold starts) still rank by how sure we are
        return self.confidence * (0.5 + 0.5 * min(1.0, self.impact))

    def as_dict(self) -> dict[str, Any]:
        return {
            "complaint": self.complaint,
            "title": self.title or TITLES[self.complaint],
            "confidence": round(self.confidence, 3),
            "evidence": self.evidence,
            "example_traces": self.example_traces,
            "fix_first": fix_first(self.complaint, self.fix_lead, self.fix_then),
            "affected_trace_ids": self.affected_trace_ids,
            "affected_count": (
                len(self.affected_trace_ids) if self.affected_count is None else self.affected_count
            ),
        }


def fix_first(complaint: str, lead: str | None = None, then: str | None = None) -> str:
    """Gives the fix-first advice: the cause-specific fix, then the complaint's generic one
    (or `then`, the part of it the measurements support; "" for none)."""
    generic = FIX_FIRST[complaint] if then is None else then
    if not lead:
        return generic
    if not generic:
        return f"{lead.rstrip('.')}."
    return f"{lead.rstrip('.')}. Then: {generic[0].lower()}{generic[1:].rstrip('.')}."


def pick_examples(ranked: list[Finding]) -> None:
    """Keeps MAX_EXAMPLES examples a finding, in rank order preferring traces no
    higher-ranked finding shows: on mixed traffic the same most-queued requests
    belong to several findings, and five examples shown three times say less
    than fifteen.  A finding with too few traces of its own still shows its best."""
    shown: set[str] = set()
    for f in ranked:
        own = [t for t in f.example_traces if t not in shown]
        picked = own[:MAX_EXAMPLES]
        if len(picked) < MAX_EXAMPLES:
            chosen = set(picked)
            picked += [t for t in f.example_traces if t not in chosen][: MAX_EXAMPLES - len(picked)]
            # keep the order of the finding's own ranking
            order = {t: i for i, t in enumerate(f.example_traces)}
            picked.sort(key=order.__getitem__)
        f.example_traces = picked
        shown.update(picked)


def clamp01(x: float) -> float:
    return 0.0 if x != x else max(0.0, min(1.0, x))


def median_surely_below(below: int | None, n: int | None) -> bool:
    """Says whether the median of `n` values is surely below a bar that `below` of them are
    below: where more than half are, both middle values are, and so is the median (the mean
    of the two middle values that `median` gives is never above the larger).  A signal's
    first check counts (cheap) where the median (every value gathered) would decide."""
    return 2 * int(below or 0) > int(n or 0)


def median_surely_above(above: int | None, n: int | None) -> bool:
    """Says whether the median of `n` values is surely above a bar that `above` of them are
    above (`median_surely_below`'s mirror: the median is never below the smaller middle value).
    A NaN that DuckDB sorts last is a middle value only where half the values are NaN or
    more: count values above the bar without NaN, and `n` with it."""
    return 2 * int(above or 0) > int(n or 0)


#: A bar that a first check counts below is drawn this much inside the threshold it stands for
#: (a ratio's), so that a median below the bar stays below the threshold in the reader's own
#: float arithmetic, however it rounds.
INSIDE = 1 - 1e-9


def confidence(strength: float, n: int, full_n: int = 200) -> float:
    """Gives a 0..1 confidence from how far past its threshold a signal is (strength ≥ 0) and n."""
    effect = 0.55 + 0.4 * (1.0 - math.exp(-max(0.0, strength)))
    support = min(1.0, math.sqrt(max(n, 0) / full_n))
    return round(clamp01(effect * (0.6 + 0.4 * support)), 3)


def pct(x: float | None) -> str:
    return "—" if x is None else f"{x * 100:.0f} %"


def ms(x: float | None) -> str:
    """Gives a duration for evidence text: whole ms, seconds from 1 s on (decided on the
    rounded figure, so 999.7 ms reads '1.00 s', not '1000 ms').  A NaN (a median of values
    that are NaN, which DuckDB sorts last) reads as no figure, as None does."""
    if x is None or x != x:
        return "—"
    return f"{x / 1000:.2f} s" if abs(round(x)) >= 1000 else f"{x:.0f} ms"


def duration(seconds: float) -> str:
    """Gives a stretch of time for evidence text, in the unit a reader would say it in:
    '45 s', '12 min', '3.5 h' (windows and parts of them, not request latencies: see `ms`)."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 120 * 60:
        return f"{seconds / 60:.0f} min"
    hours = seconds / 3600
    return f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} days"


def ev(text: str, **numbers: Any) -> dict[str, Any]:
    """One piece of evidence: a sentence and the numbers in it."""
    clean = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in numbers.items()}
    return {"text": text, **clean}


def compose(cte: str, sql: str) -> str:
    """Gives `sql` under the `req` CTE; a query with its own WITH continues that CTE list."""
    lines = sql.splitlines()
    body = [ln for ln in lines if not ln.lstrip().startswith("--")]
    text = "\n".join(body).lstrip()
    if text[:4].upper() == "WITH" and text[4:5].isspace():
        text = "," + text[4:]
    return f"{cte}\n{text}"


class Context:
    """One window of requests: the filtered `req` CTE and shared numbers, computed once."""

    def __init__(self, conn: duckdb.DuckDBPyConnection, filters: Filters) -> None:
        self.conn = conn
        self.filters = filters
        self.cte, self.params = filters.cte()

    def query(self, name: str, extra: list[Any] | None = None) -> list[dict[str, Any]]:
        """Runs named query `name` over `req`; gives rows as dicts."""
        cur = self.conn.execute(compose(self.cte, queries.load(name)), self.params + (extra or []))
        cols = [d[0] for d in cur.description or []]
        return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]

    def one(self, name: str, extra: list[Any] | None = None) -> dict[str, Any]:
        rows = self.query(name, extra)
        return rows[0] if rows else {}

    @cached_property
    def overview(self) -> dict[str, Any]:
        return self.one("diag_overview")

    @property
    def count(self) -> int:
        return int(self.overview.get("n") or 0)

    @cached_property
    def slice_ns(self) -> int:
        """Length of one time slice: about TARGET_SLICES per window, at least a second."""
        span = int(self.overview.get("span_ns") or 0)
        raw = max(MIN_SLICE_NS, span // TARGET_SLICES)
        # a round length, so the evidence reads naturally ("busiest 10 % of minutes")
        for seconds in NICE_SLICE_SECONDS:
            if seconds * 10**9 >= raw:
                return seconds * 10**9
        return raw

    def slice_label(self) -> str:
        sec = self.slice_ns / 1e9
        if sec == 60:
            return "minutes"
        return f"{sec / 60:.0f}-minute slices" if sec >= 60 else f"{sec:.0f}-second slices"

    def slices_counted(self, n: int, also: str = "") -> str:
        """Gives `n` slices with their length after them, and `also` beside it: '12 slices
        (1 s each; median slice 59 %)', '45 minutes' ("12 1-second slices" reads as one number)."""
        sec = self.slice_ns / 1e9
        said = [] if sec == 60 else [f"{duration(sec)}{' each' if n != 1 else ''}"]
        said += [also] if also else []
        counts = counted(n, "minute" if sec == 60 else "slice")
        return f"{counts} ({'; '.join(said)})" if said else counts

    @cached_property
    def carried(self) -> dict[str, Any]:
        """Gives diag_signals' row, what the window's requests carry (coverage.read_signals),
        read once: `slice_mix` sizes itself by it."""
        return self.one("diag_signals")

    @cached_property
    def instance_arrivals(self) -> list[list[Any]]:
        """Gives each instance's first and last arrival in the window as in_flight_gaps.sql
        binds them: four lists (services, instances, first and last start, ns), from
        diag_signals' pass (`carried`) rather than a scan of the window's own."""
        rows = self.carried.get("instance_arrivals") or []
        return [[r[k] for r in rows] for k in ("service", "instance", "first_ns", "last_ns")]

    @cached_property
    def slice_mix(self) -> list[dict[str, Any]] | None:
        """Gives diag_slice_mix's rows, the window counted once per time slice, tenant and
        class, which several signals add up (slice_mix.py) instead of reading every request
        apart; None where there may be more than MAX_SLICE_MIX_ROWS of them (slices × tenants
        × classes, from `carried`), and the signals run their own queries."""
        slices = int(self.overview.get("span_ns") or 0) // self.slice_ns + 2
        tenants = int(self.carried.get("tenants") or 0) + 1  # and the requests of none
        classes = max(len(self.carried.get("traffic_classes") or {}), 1)
        if slices * tenants * classes > MAX_SLICE_MIX_ROWS:
            return None
        return self.query("diag_slice_mix", [self.slice_ns])

    @property
    def time_bounds(self) -> tuple[int, int]:
        """Gives the window's time range on the server side (for steps and GPU samples)."""
        o = self.overview
        return int(o.get("first_ns") or 0), int(o.get("last_end_ns") or 0)

    def traces(self, rows: list[dict[str, Any]]) -> tuple[Affected, list[str]]:
        """Gives (affected trace ids, kept candidate example ids) from rows of trace_id, kept
        and `matched` (the rows the query matched before its LIMIT: `count(*) OVER ()`)."""
        affected = Affected()
        seen: set[str] = set()
        examples: list[str] = []
        for r in rows:
            tid = r["trace_id"]
            if tid in seen:
                continue
            seen.add(tid)
            if len(affected) < MAX_AFFECTED:
                affected.append(tid)
            if r.get("kept") and len(examples) < MAX_EXAMPLE_CANDIDATES:
                examples.append(tid)
        affected.total = max(int(rows[0].get("matched") or 0) if rows else 0, len(affected))
        return affected, examples
