"""`peak_hours`: in the busiest time slices the queue takes over (more work than capacity)."""

from __future__ import annotations

from tokentrace.analyzer.diagnosis._base import Context, Finding, confidence, ev, ms, pct

COMPLAINT = "peak_hours"
MIN_SLICES = 10
#: the busy slices must see clearly more arrivals, a queue-dominated E2E, and a real jump
MIN_ARRIVAL_RATIO = 1.3
MIN_BUSY_QUEUE_SHARE = 0.3
MIN_QUEUE_SHARE_GAIN = 0.2
MIN_E2E_RATIO = 1.5
#: a "peak" whose extra arrivals are one tenant's burst (at least this share of the
#: busy slices, and at least BURST_SHARE_RATIO times its share elsewhere) is
#: tenant interference: big_tenants_slower explains it, not the time of day
BURST_TENANT_SHARE = 0.4
BURST_SHARE_RATIO = 3.0


def busiest_slices(ctx: Context) -> tuple[dict[bool, dict], str | None]:
    """Gives the slice split (busy / rest) and the traffic class it was counted on."""
    # with mixed traffic, peaks are measured on live traffic: batch floods are batch_mode's
    cls = "interactive" if (ctx.overview.get("classes") or 0) > 1 else None
    rows = {r["busy"]: r for r in ctx.query("diag_slices", [ctx.slice_ns, cls, cls])}
    return rows, cls


def detect(ctx: Context) -> Finding | None:
    slices, _ = busiest_slices(ctx)
    busy_s, rest_s = slices.get(True), slices.get(False)
    if not busy_s or not rest_s or busy_s["slices"] + rest_s["slices"] < MIN_SLICES:
        return None
    arrival_ratio = (busy_s["arrivals_mean"] or 0.0) / max(rest_s["arrivals_mean"] or 0.0, 1e-9)
    if arrival_ratio < MIN_ARRIVAL_RATIO:
        return None
    busy_ids = [int(x) for x in busy_s["slice_ids"]]
    rows = {r["busy"]: r for r in ctx.query("diag_peak", [busy_ids, ctx.slice_ns])}
    busy, rest = rows.get(True), rows.get(False)
    if not busy or not rest:
        return None
    qb, qr = busy["queue_share"] or 0.0, rest["queue_share"] or 0.0
    e2e_ratio = (busy["e2e_p50"] or 0.0) / max(rest["e2e_p50"] or 0.0, 1e-9)
    if qb < MIN_BUSY_QUEUE_SHARE or qb - qr < MIN_QUEUE_SHARE_GAIN or e2e_ratio < MIN_E2E_RATIO:
        return None
    if _one_tenants_burst(ctx, busy_ids):
        return None
    label = ctx.slice_label()
    evidence = [
        ev(
            f"queue is {pct(qb)} of E2E for requests arriving in the busiest 10 % of {label} "
            f"vs {pct(qr)} otherwise",
            busy_queue_share=qb, baseline_queue_share=qr, slice_seconds=ctx.slice_ns / 1e9,
            busy_slices=busy_s["slices"], slices=busy_s["slices"] + rest_s["slices"],
        ),
        ev(
            f"those slices get {arrival_ratio:.1f}× the arrivals ({busy_s['arrivals_mean']:.1f} vs "
            f"{rest_s['arrivals_mean']:.1f} per slice); E2E p50 {ms(busy['e2e_p50'])} vs {ms(rest['e2e_p50'])}, "
            f"p95 {ms(busy['e2e_p95'])} vs {ms(rest['e2e_p95'])}",
            arrival_ratio=arrival_ratio, busy_e2e_p50_ms=busy["e2e_p50"], baseline_e2e_p50_ms=rest["e2e_p50"],
            busy_e2e_p95_ms=busy["e2e_p95"], baseline_e2e_p95_ms=rest["e2e_p95"],
        ),
    ]
    affected, examples = ctx.traces(ctx.query("affected_peak_hours", [busy_ids, ctx.slice_ns]))
    strength = (qb - qr - MIN_QUEUE_SHARE_GAIN) / 0.2 + (e2e_ratio - MIN_E2E_RATIO) / 2
    total = (busy["e2e_total"] or 0.0) + (rest["e2e_total"] or 0.0)
    return Finding(
        COMPLAINT,
        confidence(strength, busy["n"]),
        impact=(busy["e2e_total"] or 0.0) * qb / max(total, 1e-9) + 0.3,
        evidence=evidence,
        affected_trace_ids=affected,
        example_traces=examples,
        fix_lead=(
            f"Add capacity for the busy {label} ({arrival_ratio:.1f}× the usual arrivals): scale out "
            "before them, or refuse the excess early (a concurrency limit answering 429) instead of "
            "queueing it"
        ),
    )


def _one_tenants_burst(ctx: Context, busy_ids: list[int]) -> bool:
    """True when the busy slices' extra arrivals are one tenant's burst on a shared server."""
    shares: dict[bool, dict[str, float]] = {True: {}, False: {}}
    for r in ctx.query("diag_peak_tenants", [busy_ids, ctx.slice_ns]):
        shares[bool(r["busy"])][r["tenant"]] = r["share"] or 0.0
    busy, rest = shares[True], shares[False]
    if len(set(busy) | set(rest)) < 2 or not busy:
        return False
    tenant, share = max(busy.items(), key=lambda kv: kv[1])
    return bool(tenant) and share >= BURST_TENANT_SHARE and share >= BURST_SHARE_RATIO * rest.get(tenant, 0.0)
