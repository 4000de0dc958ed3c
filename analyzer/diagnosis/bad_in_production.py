"""`bad_in_production`: load exposes the queueing policy.

With `deployment.environment` on the traces, production is compared against
the other environments.  Without it, the most loaded quarter of time slices
(requests in flight by Little's law) is compared against the least loaded
half: that is what "locally" versus "in production" differ in.
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
#: environments named in the evidence at most
MAX_NAMED = 4


def _is_prod(env: str) -> bool:
    e = env.lower()
    return e in PROD_NAMES or e.startswith("prod")


def detect(ctx: Context) -> Finding | None:
    seen = ctx.query("diag_environments")
    envs = [r for r in seen if r["n"] >= MIN_PER_SIDE]
    prod = [r for r in envs if _is_prod(r["environment"])]
    others = [r for r in envs if not _is_prod(r["environment"])]
    if prod and others:
        return _by_environment(ctx, prod[0], min(others, key=lambda r: r["e2e_p50"]))
    return _by_load(ctx, seen)


def _why_load(seen: list[dict[str, Any]]) -> str:
    """Says why load levels stand in for environments, true to what the traces carry."""
    names = [str(r["environment"]) for r in seen]
    shown = ", ".join(names[:MAX_NAMED]) + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else "")
    if not names:
        why = "no deployment.environment on the traces"
    elif len(names) == 1:
        why = f"only one environment ({names[0]}) on the traces"
    elif not any(_is_prod(n) for n in names):
        why = f"no production among the traces' environments ({shown})"
    elif all(_is_prod(n) for n in names):
        why = f"only production environments on the traces ({shown})"
    else:
        counts = ", ".join(f"{r['environment']}: {r['n']}" for r in seen[:MAX_NAMED])
        why = f"too few requests on one side to compare environments ({counts}; {MIN_PER_SIDE} needed)"
    return f"{why}, so load levels stand in for local vs production"


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


def _by_load(ctx: Context, seen: list[dict[str, Any]]) -> Finding | None:
    rows = {r["load"]: r for r in ctx.query("diag_concurrency", [ctx.slice_ns] * 3)}
    high, low = rows.get("high"), rows.get("low")
    if not high or not low or high["n"] < MIN_PER_SIDE or low["n"] < MIN_PER_SIDE:
        return None
    ratio = (high["e2e_p50"] or 0.0) / max(low["e2e_p50"] or 0.0, 1e-9)
    qh, ql = high["queue_share"] or 0.0, low["queue_share"] or 0.0
    if ratio < MIN_E2E_RATIO or qh < MIN_PROD_QUEUE_SHARE or qh - ql < MIN_QUEUE_SHARE_GAIN:
        return None
    evidence = [
        ev(
            f"at high load ({high['in_flight']:.1f} requests in flight) queue is {pct(qh)} of E2E "
            f"vs {pct(ql)} at low load ({low['in_flight']:.1f} in flight)",
            in_flight=high["in_flight"], baseline_in_flight=low["in_flight"],
            queue_share=qh, baseline_queue_share=ql,
        ),
        ev(
            f"E2E p50 {ms(high['e2e_p50'])} vs {ms(low['e2e_p50'])}; {_why_load(seen)}",
            e2e_p50_ms=high["e2e_p50"], baseline_e2e_p50_ms=low["e2e_p50"],
            environments=[r["environment"] for r in seen],
        ),
    ]
    # the requests the comparison speaks of: the high-load slices' queued ones
    affected, examples = ctx.traces(ctx.query("affected_load", [ctx.slice_ns] * 3 + [0.5]))
    strength = (qh - ql - MIN_QUEUE_SHARE_GAIN) / 0.15 + (ratio - MIN_E2E_RATIO) / 1.5
    # weaker than an environment comparison: load and time-of-day overlap (peak_hours)
    return Finding(
        COMPLAINT,
        confidence(strength, high["n"]) * 0.8,
        impact=qh * 0.5,
        evidence=evidence,
        affected_trace_ids=affected,
        affected_count=affected.total,
        example_traces=examples,
        basis="load",
    )
