"""big_tenants_slower's first check on its queue contrast, before diag_tenant_groups' quantiles.

The heavy tenants' queue p95 against the rest's decides the contrast: one of them at least
MIN_QUEUE_P95_MS, and the larger at least MIN_QUEUE_RATIO times the smaller.  Counted per
bucket of queue time (PER_DOUBLING buckets a doubling), each group's p95 lies within the
bucket holding the values it is interpolated between; where those bounds put both p95s
below the bar, or surely within the ratio of each other (a FIFO server queues every tenant
alike), the quantiles (0.6 CPU-s at 10 M requests, two sorts of every request's times) are
not taken.  The counts cost 0.26.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tokentrace.analyzer.diagnosis._base import INSIDE, Context

#: Buckets of queue time a doubling: a p95 is placed within 2^(1/8), 9 %, or a bucket more
#: on either side where it falls on an edge.
PER_DOUBLING = 8
#: The quantile the contrast compares.
P95 = 0.95
#: How much wider than its buckets' edges a bound is drawn, so that a value the database's
#: log2 put one bucket off on an edge (rounding) still lies within it.
EDGE_SLACK = 1e-9


@dataclass(slots=True)
class Group:
    """One side's requests: how many fall in each bucket of queue time, their E2E time."""

    counts: dict[float, int] = field(default_factory=dict)
    e2e_total: float = 0.0


def groups(ctx: Context, heavy: list[str], cls: str | None) -> dict[bool, Group]:
    """Gives the heavy tenants' requests (True) and the other named tenants' (False), of class
    `cls` (None: all), counted per bucket of queue time; a side without requests is absent."""
    rows = ctx.query("diag_tenant_queue_buckets", [heavy, PER_DOUBLING, cls, cls])
    e2e: dict[bool, list[float]] = {}
    out: dict[bool, Group] = {}
    for r in rows:
        side = bool(r["heavy"])
        out.setdefault(side, Group()).counts[r["bucket"]] = int(r["n"])
        e2e.setdefault(side, []).append(float(r["e2e_total"] or 0.0))
    for side, group in out.items():
        group.e2e_total = math.fsum(e2e[side])
    return out


def p95_bounds(counts: dict[float, int]) -> tuple[float, float]:
    """Gives bounds of the p95 (`quantile_cont`) of values counted per bucket: it is
    interpolated between the values of rank floor and ceil of (n - 1) × 0.95 (counted from 0);
    a rank more on either side allows for that product's rounding."""
    n = sum(counts.values())
    at = (n - 1) * P95
    lo_rank, hi_rank = max(math.floor(at) - 1, 0), min(math.ceil(at) + 1, n - 1)
    lo = hi = None
    seen = 0
    for bucket in sorted(counts):
        seen += counts[bucket]
        if lo is None and seen > lo_rank:
            lo = bucket
        if seen > hi_rank:
            hi = bucket
            break
    if lo is None or hi is None or not math.isfinite(lo) or not math.isfinite(hi):
        return -math.inf, math.inf  # NaN or infinite queue times: no bounds
    lower = -math.inf if lo <= 0 else 2 ** (lo / PER_DOUBLING) * (1 - EDGE_SLACK)
    return lower, 2 ** ((hi + 1) / PER_DOUBLING) * (1 + EDGE_SLACK)


def surely_no_contrast(sides: dict[bool, Group], min_p95_ms: float, min_ratio: float) -> bool:
    """Says whether the queue contrast surely fails: the larger p95 below `min_p95_ms`, or
    below `min_ratio` times the smaller (at least 1 ms, as big_tenants divides by)."""
    bounds = [p95_bounds(g.counts) for g in sides.values()]
    larger = max(hi for _, hi in bounds)
    smaller = min(lo for lo, _ in bounds)
    return larger < min_p95_ms * INSIDE or larger / max(smaller, 1.0) < min_ratio * INSIDE
