"""What the per-slice signals read, added up from one pass over the window.

peak_hours (arrivals per slice, the busy slices' queue and E2E sums, their tenant mix),
batch_mode (live requests in slices with and without batch traffic) and big_tenants (each
tenant's volume) each read every request for a few counts and sums by time slice or tenant.
`Context.slice_mix` counts the window once per time slice, tenant and class (a few hundred
rows), and each function here gives the rows its named query gave, from those: over a lake
every statement opens a snapshot and decodes the Parquet again, so one pass saves twice.
Where the window may have too many of those rows (`MAX_SLICE_MIX_ROWS`: tenants by the
hundred), the pass is not run and each function runs its named query instead.

Counts are the same integers; a sum is the float sum of the rows' sums (`math.fsum`), the
query's to its last digits (DuckDB sums in no fixed order either).  `tenant`,
`traffic_class`, `queue_ms` and `e2e_ms` are NOT NULL (store/schema), as the sums here take.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from tokentrace.analyzer.diagnosis._base import Context

#: One decile of the slices, as diag_slices' `ntile(10)` takes them: the busiest tenth.
DECILES = 10


def busy_split(ctx: Context, cls: str | None) -> dict[bool, dict[str, Any]]:
    """Gives diag_slices' rows by `busy`: the slices among the busiest tenth by arrivals of
    class `cls` (None: all), and the rest; each side's slice count, mean arrivals, slice ids."""
    mix = ctx.slice_mix
    if mix is None:
        return {r["busy"]: r for r in ctx.query("diag_slices", [ctx.slice_ns, cls, cls])}
    arrivals: dict[int, int] = defaultdict(int)
    for r in mix:
        if cls is None or r["traffic_class"] == cls:
            arrivals[r["slice"]] += r["n"]
    # ntile(10) over (arrivals DESC, slice): its first tile holds ceil(k / 10) of k slices
    ranked = sorted(arrivals.items(), key=lambda kv: (-kv[1], kv[0]))
    busy = -(-len(ranked) // DECILES)
    sides: dict[bool, dict[str, Any]] = {}
    for side, part in ((True, ranked[:busy]), (False, ranked[busy:])):
        if part:
            sides[side] = {
                "busy": side,
                "slices": len(part),
                "arrivals_mean": sum(n for _, n in part) / len(part),
                "slice_ids": [s for s, _ in part],
            }
    return sides


def per_slice(ctx: Context) -> list[dict[str, Any]]:
    """Gives diag_peak's rows: per time slice, its requests, their queue and E2E time, and
    their E2E count and range."""
    mix = ctx.slice_mix
    if mix is None:
        return ctx.query("diag_peak", [ctx.slice_ns])
    by_slice: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in mix:
        by_slice[r["slice"]].append(r)
    return [_slice_row(s, rows) for s, rows in by_slice.items()]


def _slice_row(slice_id: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    # queue_ms and e2e_ms are NOT NULL: every row has its sums and its range
    return {
        "slice": slice_id,
        "n": sum(r["n"] for r in rows),
        "queue_total": math.fsum(r["queue_total"] for r in rows),
        "e2e_total": math.fsum(r["e2e_total"] for r in rows),
        "e2e_n": sum(r["e2e_n"] for r in rows),
        "e2e_min": min(r["e2e_min"] for r in rows),
        "e2e_max": max(r["e2e_max"] for r in rows),
    }


def tenant_shares(ctx: Context, busy_ids: list[int]) -> list[dict[str, Any]]:
    """Gives diag_peak_tenants' rows: each tenant's share of the arrivals in the busy slices
    (`busy`) and elsewhere."""
    mix = ctx.slice_mix
    if mix is None:
        return ctx.query("diag_peak_tenants", [ctx.slice_ns, busy_ids])
    busy = set(busy_ids)
    counts: dict[tuple[bool, str], int] = defaultdict(int)
    for r in mix:
        counts[(r["slice"] in busy, r["tenant"])] += r["n"]
    totals: dict[bool, int] = defaultdict(int)
    for (side, _), n in counts.items():
        totals[side] += n
    return [
        {"busy": side, "tenant": tenant, "share": n / totals[side]}
        for (side, tenant), n in counts.items()
    ]


def batch_sides(ctx: Context) -> dict[bool, int]:
    """Gives diag_batch_mode_sides' counts: live (not batch) requests arriving in slices with
    batch traffic (True) and in slices without (False)."""
    mix = ctx.slice_mix
    if mix is None:
        rows = ctx.query("diag_batch_mode_sides", [ctx.slice_ns])
        return {r["with_batch"]: r["n"] for r in rows}
    batch: dict[int, int] = defaultdict(int)
    live: dict[int, int] = defaultdict(int)
    for r in mix:
        is_batch = r["traffic_class"] == "batch"
        batch[r["slice"]] += r["n"] if is_batch else 0
        live[r["slice"]] += 0 if is_batch else r["n"]
    sides: dict[bool, int] = {}
    for s, n in live.items():
        sides[batch[s] > 0] = sides.get(batch[s] > 0, 0) + n
    return sides


def tenant_volumes(ctx: Context, cls: str | None) -> list[dict[str, Any]]:
    """Gives diag_tenants' rows: per named tenant of class `cls` (None: all) its requests and
    tokens, the most tokens first (then requests, then name)."""
    mix = ctx.slice_mix
    if mix is None:
        return ctx.query("diag_tenants", [cls, cls])
    n: dict[str, int] = defaultdict(int)
    tokens: dict[str, int] = defaultdict(int)
    for r in mix:
        tenant = r["tenant"]
        if tenant == "" or (cls is not None and r["traffic_class"] != cls):
            continue
        n[tenant] += r["n"]
        tokens[tenant] += r["tokens"]
    order = sorted(n, key=lambda t: (-tokens[t], -n[t], t))
    return [{"tenant": t, "n": n[t], "tokens": tokens[t]} for t in order]
