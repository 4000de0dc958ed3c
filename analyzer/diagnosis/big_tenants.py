"""`big_tenants_slower`: heavy workloads block light ones (queue + batching interaction).

Tenants are split by volume (tokens, else requests): the heaviest tenants
holding at least half the volume against the rest.  The signal is a queue that
differs by tenant group, which a fair FIFO server would not show; shared
batches (engine steps holding both groups' requests) are the mechanism.  Where
both groups queue alike (a FIFO engine: the heavy tenant's burst fills the
queue for everyone), the lighter tenants' own contrast stands in: their wait
for the first token when the heavy tenants had requests in flight on their
instance against when they had none.
"""

from __future__ import annotations

from typing import Any

from tokentrace.analyzer.diagnosis import slice_mix, tenant_queues
from tokentrace.analyzer.diagnosis._base import (
    INSIDE,
    Context,
    Finding,
    confidence,
    ev,
    median_surely_below,
    ms,
    pct,
)

COMPLAINT = "big_tenants_slower"
MIN_PER_TENANT = 10
MIN_QUEUE_RATIO = 2.0
MIN_QUEUE_P95_MS = 50.0
MIN_E2E_RATIO = 1.3
#: The lighter tenants beside the heavy ones' requests against without them: requests on
#: each side, and how much longer they must wait for the first token (times, and ms more).
MIN_BESIDE = 5
MIN_BESIDE_RATIO = 3.0
MIN_BESIDE_GAIN_MS = 200.0


def detect(ctx: Context) -> Finding | None:
    cls = "interactive" if (ctx.overview.get("classes") or 0) > 1 else None
    tenants = [r for r in slice_mix.tenant_volumes(ctx, cls) if r["n"] >= MIN_PER_TENANT]
    if len(tenants) < 2:
        return None
    use_tokens = sum(r["tokens"] for r in tenants) > 0
    volume = [(r["tokens"] if use_tokens else r["n"]) for r in tenants]
    total = sum(volume)
    heavy: list[dict[str, Any]] = []
    acc = 0.0
    for r, v in zip(tenants, volume, strict=True):
        if acc >= total / 2 or len(heavy) >= len(tenants) // 2 + (len(tenants) == 2):
            break
        heavy.append(r)
        acc += v
    heavy = heavy[: max(1, len(tenants) - 1)]
    light = [r for r in tenants if r not in heavy]
    heavy_names = [r["tenant"] for r in heavy]
    # counts per bucket of queue time first: where they rule the queue contrast out (every
    # tenant queues alike), the lighter tenants' own contrast decides without the quantiles
    first = tenant_queues.groups(ctx, heavy_names, cls)
    if True not in first or False not in first:
        return None
    if tenant_queues.surely_no_contrast(first, MIN_QUEUE_P95_MS, MIN_QUEUE_RATIO):
        light_names = [r["tenant"] for r in light]
        share = acc / max(total, 1e-9)
        return _beside_heavy(ctx, heavy_names, light_names, cls, share, first[True].e2e_total)
    groups = {g["heavy"]: g for g in ctx.query("diag_tenant_groups", [heavy_names, cls, cls])}
    h, lt = groups.get(True), groups.get(False)
    if not h or not lt:
        return None
    worse, better, worse_rows = (h, lt, heavy) if h["queue_p95"] >= lt["queue_p95"] else (lt, h, light)
    q_ratio = worse["queue_p95"] / max(better["queue_p95"], 1.0)
    e_ratio = worse["e2e_p95"] / max(better["e2e_p95"], 1e-9)
    if worse["queue_p95"] < MIN_QUEUE_P95_MS or q_ratio < MIN_QUEUE_RATIO or e_ratio < MIN_E2E_RATIO:
        light_names = [r["tenant"] for r in light]
        return _beside_heavy(ctx, heavy_names, light_names, cls, acc / max(total, 1e-9), h["e2e_total"])
    many = len(worse_rows) > 1
    who = ("the heaviest tenants" if many else "the heaviest tenant") if worse is h else (
        "lighter tenants" if many else "the lighter tenant")
    names = ", ".join(r["tenant"] for r in worse_rows[:5])
    # with mixed traffic the tenants are compared on live requests: the figures say so, since
    # the report's tables are of every request
    whose = f"{cls} requests: " if cls else ""
    evidence = [
        ev(
            f"{whose}{who} ({names}) {'wait' if many else 'waits'} longer in the queue: p95 {ms(worse['queue_p95'])} vs "
            f"{ms(better['queue_p95'])}; E2E p95 {ms(worse['e2e_p95'])} vs {ms(better['e2e_p95'])}",
            queue_p95_ms=worse["queue_p95"], baseline_queue_p95_ms=better["queue_p95"],
            e2e_p95_ms=worse["e2e_p95"], baseline_e2e_p95_ms=better["e2e_p95"],
        ),
        ev(
            f"{', '.join(heavy_names[:5])} {'send' if len(heavy_names) > 1 else 'sends'} "
            f"{pct(acc / max(total, 1e-9))} of the "
            f"{f'{cls} ' if cls else ''}{'tokens' if use_tokens else 'requests'} across {len(tenants)} tenants",
            heavy_volume_share=acc / max(total, 1e-9), tenants=len(tenants),
        ),
    ]
    lo, hi = ctx.time_bounds
    shared = ctx.one("diag_tenant_batches", [lo, hi, heavy_names, heavy_names])
    if shared.get("steps"):
        evidence.append(
            ev(
                f"{shared['shared']} of {shared['steps']} multi-request engine steps batched heavy and "
                f"light tenants together (mean batch {shared['shared_batch'] or 0:.1f})",
                shared_steps=shared["shared"], steps=shared["steps"],
                shared_batch_mean=shared["shared_batch"],
            )
        )
    affected, examples = ctx.traces(ctx.query("affected_tenants", [[r["tenant"] for r in worse_rows]]))
    strength = (q_ratio - MIN_QUEUE_RATIO) / 2 + (e_ratio - MIN_E2E_RATIO) / 1.5
    return Finding(
        COMPLAINT,
        confidence(strength, int(min(h["n"], lt["n"]))),
        impact=worse["queue_share"] * worse["e2e_total"] / max(h["e2e_total"] + lt["e2e_total"], 1e-9) + 0.2,
        evidence=evidence,
        affected_trace_ids=affected,
        affected_count=affected.total,
        example_traces=examples,
    )


def _beside_surely_none(ctx: Context, heavy: list[str], cls: str | None) -> bool:
    """The first check on the lighter tenants' contrast, before its sweep (diag_tenant_beside,
    5-8 CPU-s at 10 M requests): says whether it surely gives no finding, from the light
    requests with no heavy request in flight (few where the heavy tenants never stop) and
    counts over the rest (diag_tenant_apart): too few on a side, or more than half of those
    beside the heavy requests waiting less than MIN_BESIDE_RATIO times, or MIN_BESIDE_GAIN_MS
    more than, the median apart."""
    first = ctx.one(
        "diag_tenant_apart",
        [
            heavy,
            cls,
            cls,
            *ctx.instance_arrivals,  # in_flight_gaps' light_ends
            MIN_BESIDE_RATIO * INSIDE,
            MIN_BESIDE_GAIN_MS,
            MIN_BESIDE_GAIN_MS,
        ],
    )
    if first["reversed"]:
        return False  # a request that ends before it starts: only the sweep counts as it does
    if first["apart_n"] < MIN_BESIDE or first["beside_n"] < MIN_BESIDE:
        return True
    return not first["beside_wait_n"] or median_surely_below(
        first["beside_wait_below"], first["beside_wait_n"]
    )


def _beside_heavy(
    ctx: Context, heavy: list[str], light: list[str], cls: str | None, heavy_share: float,
    heavy_e2e_ms: float | None,
) -> Finding | None:
    """Gives the finding where the lighter tenants wait far longer for their first token while
    the heavy tenants have requests in flight on their instance than while they have none.
    Its impact is the E2E of the heavy requests and of the light ones beside them: the
    heavy tenants' traffic fills the queue they all wait in."""
    if _beside_surely_none(ctx, heavy, cls):
        return None
    rows = {r["beside"]: r for r in ctx.query("diag_tenant_beside", [heavy, cls, cls])}
    beside, alone = rows.get(True), rows.get(False)
    if not beside or not alone or beside["n"] < MIN_BESIDE or alone["n"] < MIN_BESIDE:
        return None
    wait, base = beside["wait_p50"] or 0.0, alone["wait_p50"] or 0.0
    ratio = wait / max(base, 1e-9)
    if ratio < MIN_BESIDE_RATIO or wait - base < MIN_BESIDE_GAIN_MS:
        return None
    whose = f"{cls} requests: " if cls else ""
    light_names, heavy_names = ", ".join(light[:5]), ", ".join(heavy[:5])
    evidence = [
        ev(
            f"{whose}the lighter tenants ({light_names}) wait {ms(wait)} for the first token (p50) "
            f"when {heavy_names} {'have' if len(heavy) > 1 else 'has'} requests in flight on their "
            f"instance vs {ms(base)} when not ({ratio:.1f}×); their queue p50 {ms(beside['queue_p50'])} "
            f"vs {ms(alone['queue_p50'])}",
            wait_p50_ms=wait, baseline_wait_p50_ms=base, ratio=ratio, queue_p50_ms=beside["queue_p50"],
            baseline_queue_p50_ms=alone["queue_p50"], requests=beside["n"], baseline_requests=alone["n"],
            heavy_in_flight_p50=beside["in_flight_p50"],
        ),
        ev(
            f"{heavy_names} {'send' if len(heavy) > 1 else 'sends'} {pct(heavy_share)} of the "
            f"{f'{cls} ' if cls else ''}volume; both groups queue alike, so the heavy requests fill "
            "the queue everyone waits in",
            heavy_volume_share=heavy_share,
        ),
    ]
    affected, examples = ctx.traces(ctx.query("affected_tenants_beside", [heavy, cls, cls]))
    strength = (ratio - MIN_BESIDE_RATIO) / 3 + min(1.0, (wait - base) / 2000.0)
    total = float(ctx.overview.get("e2e_total") or 1.0)
    return Finding(
        COMPLAINT,
        confidence(strength, beside["n"] + alone["n"]),
        impact=((beside["e2e_total"] or 0.0) + (heavy_e2e_ms or 0.0)) / total + 0.2,
        evidence=evidence,
        affected_trace_ids=affected,
        affected_count=affected.total,
        example_traces=examples,
    )
