"""`cold_start`: the first requests of an instance (start, deploy, idle) pay initialization."""

from __future__ import annotations

from tokentrace._words import counted
from tokentrace.analyzer.diagnosis._base import Context, Finding, confidence, ev, ms

COMPLAINT = "cold_start"
MIN_WARM = 20
MIN_RATIO = 3.0
MIN_GAIN_MS = 200.0
#: first-request-of-an-instance counts as a cold start only with this many instances in view
MIN_INSTANCES = 2
#: One slow first request on one instance is an anecdote (the SDK marks every process's
#: first request): a finding needs cold requests on MIN_INSTANCES instances, or this many
#: on fewer (one instance going cold again after each idle gap).
MIN_COLD_REQUESTS = 3


def detect(ctx: Context) -> Finding | None:
    rows = {r["cold"]: r for r in ctx.query("diag_cold_start", [MIN_INSTANCES])}
    cold, warm = rows.get(True), rows.get(False)
    if not cold or not warm or warm["n"] < MIN_WARM:
        return None
    if cold["instances"] < MIN_INSTANCES and cold["n"] < MIN_COLD_REQUESTS:
        return None
    ratio = (cold["wait_p50"] or 0.0) / max(warm["wait_p50"] or 0.0, 1e-9)
    gain = (cold["wait_p50"] or 0.0) - (warm["wait_p50"] or 0.0)
    if ratio < MIN_RATIO or gain < MIN_GAIN_MS:
        return None
    evidence = [
        ev(
            f"{counted(cold['n'], 'cold request')} on {counted(cold['instances'], 'instance')} "
            f"waited {ms(cold['wait_p50'])} "
            f"for the first token (p50) vs {ms(warm['wait_p50'])} once warm ({ratio:.1f}×)",
            cold_requests=cold["n"], instances=cold["instances"], cold_ttft_p50_ms=cold["wait_p50"],
            warm_ttft_p50_ms=warm["wait_p50"], ratio=ratio,
        )
    ]
    affected, examples = ctx.traces(ctx.query("affected_cold_start", [MIN_INSTANCES]))
    strength = (ratio - MIN_RATIO) / 3 + min(1.0, gain / 2000.0)
    total = float(ctx.overview.get("e2e_total") or 1.0)
    return Finding(
        COMPLAINT,
        confidence(strength, cold["n"] * 20),
        impact=(cold["e2e_total"] or 0.0) / total,
        evidence=evidence,
        affected_trace_ids=affected,
        affected_count=affected.total,
        example_traces=examples,
    )
