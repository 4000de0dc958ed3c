"""`kv_cache_pressure`: KV-cache memory near full (engine steps), or GPU memory pinned (NVML)."""

from __future__ import annotations

from tokentrace.analyzer.diagnosis._base import Context, Finding, confidence, ev, pct

COMPLAINT = "kv_cache_pressure"
HIGH_KV = 0.9
HIGH_MEM = 0.97
MIN_STEPS = 20
MIN_HIGH_FRACTION = 0.25


def detect(ctx: Context) -> Finding | None:
    lo, hi = ctx.time_bounds
    svc = ctx.filters.service
    evidence = []
    strength = -1.0
    n = 0
    kv = ctx.one("diag_kv", [HIGH_KV, HIGH_KV, HIGH_KV, lo, hi, svc, svc])
    if (kv.get("steps") or 0) >= MIN_STEPS:
        frac = kv["high"] / kv["steps"]
        if frac >= MIN_HIGH_FRACTION:
            n = kv["steps"]
            strength = (frac - MIN_HIGH_FRACTION) / 0.25
            text = f"KV cache ≥ {pct(HIGH_KV)} full in {pct(frac)} of {n} engine steps (max {pct(kv['kv_max'])})"
            if kv["depth_high"] is not None and kv["depth_low"] is not None:
                text += f"; queue depth {kv['depth_high']:.1f} then vs {kv['depth_low']:.1f} otherwise"
            evidence.append(
                ev(text, high_kv_fraction=frac, steps=n, kv_max=kv["kv_max"],
                   queue_depth_high=kv["depth_high"], queue_depth_low=kv["depth_low"])
            )
    g = ctx.one("diag_gpu", [101.0, HIGH_MEM, lo, hi, svc, svc])
    if (g.get("mem_known") or 0) >= MIN_STEPS:
        frac = g["mem_high"] / g["mem_known"]
        if frac >= MIN_HIGH_FRACTION:
            n = max(n, g["mem_known"])
            strength = max(strength, (frac - MIN_HIGH_FRACTION) / 0.25)
            evidence.append(
                ev(f"GPU memory ≥ {pct(HIGH_MEM)} used in {pct(frac)} of NVML samples",
                   high_memory_fraction=frac, samples=g["mem_known"])
            )
    if not evidence:
        return None
    queue = float(ctx.overview.get("queue_share") or 0.0)
    evidence.append(ev(f"queue is {pct(queue)} of E2E in this window", queue_share=queue))
    if kv.get("high"):
        rows = ctx.query("affected_kv_cache_pressure", [ctx.slice_ns, HIGH_KV, lo, hi, ctx.slice_ns])
    else:
        rows = ctx.query("affected_gpu_saturation", [ctx.slice_ns, 0.0, lo, hi, ctx.slice_ns])
    affected, examples = ctx.traces(rows)
    return Finding(
        COMPLAINT,
        confidence(strength, n),
        impact=queue,
        evidence=evidence,
        affected_trace_ids=affected,
        affected_count=affected.total,
        example_traces=examples,
    )
