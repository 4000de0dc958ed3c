"""`big_tenants_slower`: heavy workloads block light ones (queue + batching interaction).

Tenants are split by volume (tokens, else requests): the heaviest tenants
holding at least half the volume against the rest.  The signal is a queue that
differs by tenant group, which a fair FIFO server would not show; shared
batches (engine steps holding both groups' requests) are the mechanism.
"""

from __future__ import annotations

from typing import Any

from tokentrace.analyzer.diagnosis._base import Context, Finding, confidence, ev, ms, pct

COMPLAINT = "big_tenants_slower"
MIN_PER_TENANT = 10
MIN_QUEUE_RATIO = 2.0
MIN_QUEUE_P95_MS = 50.0
MIN_E2E_RATIO = 1.3


def detect(ctx: Context) -> Finding | None:
    cls = "interactive" if (ctx.overview.get("classes") or 0) > 1 else None
    tenants = [r for r in ctx.query("diag_tenants", [cls, cls]) if r["n"] >= MIN_PER_TENANT]
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
    groups = {g["heavy"]: g for g in ctx.query("diag_tenant_groups", [heavy_names, cls, cls])}
    h, lt = groups.get(True), groups.get(False)
    if not h or not lt:
        return None
    worse, better, worse_rows = (h, lt, heavy) if h["queue_p95"] >= lt["queue_p95"] else (lt, h, light)
    q_ratio = worse["queue_p95"] / max(better["queue_p95"], 1.0)
    e_ratio = worse["e2e_p95"] / max(better["e2e_p95"], 1e-9)
    if worse["queue_p95"] < MIN_QUEUE_P95_MS or q_ratio < MIN_QUEUE_RATIO or e_ratio < MIN_E2E_RATIO:
        return None
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
