"""`bad_in_production`: load exposes the queueing policy.

"Fine locally, bad in production" is a contrast between deployments, so it is asserted only
where the traces say which is which: `deployment.environment.name` (or
`deployment.environment`) with a production environment and another, each with
MIN_PER_SIDE requests.  Without them there is no finding: load differences within one
deployment are peak_hours' story (or none), and the report's coverage says what would decide
it (`coverage.py`).
"""

from __future__ import annotations

from typing import Any

from tokentrace.analyzer.diagnosis._base import Context, Finding, confidence, ev, ms, pct

COMPLAINT = "bad_in_production"
PROD_NAMES = ("prod", "production", "prd", "live")
MIN_PER_SIDE = 20
MIN_E2E_RATIO = 1.3
MIN_QUEUE_SHARE_GAIN = 0.15
MIN_PROD_QUEUE_SHARE = 0.25


def is_prod(env: str) -> bool:
    """Says whether an environment's name names production."""
    e = env.lower()
    return e in PROD_NAMES or e.startswith("prod")


def detect(ctx: Context) -> Finding | None:
    envs = [r for r in ctx.query("diag_environments") if r["n"] >= MIN_PER_SIDE]
    prod = [r for r in envs if is_prod(r["environment"])]
    others = [r for r in envs if not is_prod(r["environment"])]
    if not prod or not others:
        return None
    return _by_environment(ctx, prod[0], min(others, key=lambda r: r["e2e_p50"]))


def _by_environment(ctx: Context, prod: dict[str, Any], base: dict[str, Any]) -> Finding | None:
    # the median or the tail: production pain often shows in p95 first
    ratio = max(
        (prod["e2e_p50"] or 0.0) / max(base["e2e_p50"] or 0.0, 1e-9),
        (prod["e2e_p95"] or 0.0) / max(base["e2e_p95"] or 0.0, 1e-9),
    )
    qp, qb = prod["queue_share"] or 0.0, base["queue_share"] or 0.0
    if ratio < MIN_E2E_RATIO or qp < MIN_PROD_QUEUE_SHARE or qp - qb < MIN_QUEUE_SHARE_GAIN:
        return None
    p, b = prod["environment"], base["environment"]
    evidence = [
        ev(
            f"queue is {pct(qp)} of E2E in {p} vs {pct(qb)} in {b}",
            environment=p, baseline_environment=b, queue_share=qp, baseline_queue_share=qb,
        ),
        ev(
            f"E2E p50 {ms(prod['e2e_p50'])} in {p} vs {ms(base['e2e_p50'])} in {b} "
            f"(p95 {ms(prod['e2e_p95'])} vs {ms(base['e2e_p95'])}); compute p50 is "
            f"{ms(prod['compute_p50'])} vs {ms(base['compute_p50'])}",
            e2e_p50_ms=prod["e2e_p50"], baseline_e2e_p50_ms=base["e2e_p50"],
            e2e_p95_ms=prod["e2e_p95"], baseline_e2e_p95_ms=base["e2e_p95"],
            requests=prod["n"], baseline_requests=base["n"],
        ),
    ]
    affected, examples = ctx.traces(ctx.query("affected_environment", [p]))
    strength = (qp - qb - MIN_QUEUE_SHARE_GAIN) / 0.15 + (ratio - MIN_E2E_RATIO) / 1.5
    total = float(ctx.overview.get("e2e_total") or 1.0)
    return Finding(
        COMPLAINT,
        min(0.99, confidence(strength, min(prod["n"], base["n"])) + 0.05),
        impact=qp * (prod["e2e_total"] or 0.0) / total + 0.3,
        evidence=evidence,
        affected_trace_ids=affected,
        affected_count=affected.total,
        example_traces=examples,
        basis="environment",
    )
