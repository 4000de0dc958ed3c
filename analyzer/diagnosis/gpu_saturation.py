"""`gpu_saturation`: NVML shows the GPU busy most of the time while work queues."""

from __future__ import annotations

from tokentrace.analyzer.diagnosis._base import Context, Finding, confidence, ev, pct

COMPLAINT = "gpu_saturation"
SATURATED_PCT = 95.0
MIN_SAMPLES = 10
MIN_SATURATED_FRACTION = 0.5
#: a busy GPU with an empty queue is healthy: only report it when requests wait
MIN_QUEUE_SHARE = 0.1


def detect(ctx: Context) -> Finding | None:
    lo, hi = ctx.time_bounds
    svc = ctx.filters.service
    g = ctx.one("diag_gpu", [SATURATED_PCT, 0.95, lo, hi, svc, svc])
    n = int(g.get("samples") or 0)
    if n < MIN_SAMPLES:
        return None
    frac = (g["saturated"] or 0) / n
    queue = float(ctx.overview.get("queue_share") or 0.0)
    if frac < MIN_SATURATED_FRACTION or queue < MIN_QUEUE_SHARE:
        return None
    evidence = [
        ev(
            f"GPU utilization ≥ {SATURATED_PCT:.0f} % in {pct(frac)} of {n} NVML samples (mean {g['util_mean']:.0f} %)",
            saturated_fraction=frac, samples=n, utilization_mean_pct=g["util_mean"],
        ),
        ev(f"meanwhile queue is {pct(queue)} of E2E: work waits for the GPU", queue_share=queue),
    ]
    affected, examples = ctx.traces(ctx.query(
        "affected_gpu_saturation", [ctx.slice_ns, SATURATED_PCT, lo, hi, ctx.slice_ns]
    ))
    return Finding(
        COMPLAINT,
        confidence((frac - MIN_SATURATED_FRACTION) / 0.2 + (queue - MIN_QUEUE_SHARE) / 0.2, n),
        impact=queue,
        evidence=evidence,
        affected_trace_ids=affected,
        affected_count=affected.total,
        example_traces=examples,
    )
