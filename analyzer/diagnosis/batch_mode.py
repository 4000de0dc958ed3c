"""`batch_mode_breaks_live`: aggressive batching stretches live requests' TTFT and ITL.

The contrast is live requests beside batch jobs against live requests without them: time
slices where batch traffic ran against those where it did not, else (batch traffic in every
slice) live requests that arrived while batch requests were in flight on their instance
against those that arrived while none were (request-level: no engine steps needed).  Where
batch traffic never stops, large batches stand in: the engine's step batch sizes where it
gives them, else how many batch requests were in flight beside the live ones.
"""

from __future__ import annotations

from typing import Any

from tokentrace.analyzer.diagnosis import slice_mix
from tokentrace.analyzer.diagnosis._base import (
    INSIDE,
    Context,
    Finding,
    confidence,
    ev,
    median_surely_below,
    ms,
)

COMPLAINT = "batch_mode_breaks_live"
MIN_PER_SIDE = 10
MIN_RATIO = 1.5
MIN_TTFT_GAIN_MS = 100.0
#: without a batch-free baseline, steps this large under live requests are "aggressive"
LARGE_BATCH = 32


def _ratio(a: float | None, b: float | None) -> float:
    if a is None or b is None or b <= 0:
        return 0.0
    return a / b


def _comparisons(
    under: dict[str, Any], alone: dict[str, Any], ttft_decides: bool, who: str
) -> list[dict[str, Any]]:
    """Gives the evidence lines: the measure that decided the finding first (said of `who`),
    then the others that point the same way, and last those that do not (they are facts, not
    the case)."""
    measures = [
        ("TTFT p50", "ttft_p50", "ttft_p50_ms"),
        ("TPOT p50", "tpot_p50", "tpot_p50_ms"),
        ("queue wait p50", "queue_wait_p50", "queue_wait_p50_ms"),
    ]
    decider = "ttft_p50" if ttft_decides else "tpot_p50"
    # decider first; then by how much worse live requests fare beside batch jobs
    # (equal or unmeasured counts as 1×: neither worse nor better, so before the better ones)
    measures.sort(key=lambda m: (m[1] != decider, -(_ratio(under[m[1]], alone[m[1]]) or 1.0)))
    lines = []
    for i, (label, col, key) in enumerate(measures):
        r = _ratio(under[col], alone[col])
        text = f"{label} {ms(under[col])} vs {ms(alone[col])} without them"
        text += f" ({r:.1f}×)" if r else ""
        if i == 0:
            text = f"{who}: {text}"
        numbers: dict[str, Any] = {key: under[col], f"baseline_{key}": alone[col]}
        if i == 0:
            numbers |= {"requests": under["n"], "baseline_requests": alone["n"]}
            if under.get("in_flight_p50") is not None:
                numbers["batch_in_flight_p50"] = under["in_flight_p50"]
        lines.append(ev(text, **numbers))
    # one line for the case, one for the other measures, so the report stays short
    rest = lines[1:]
    merged = ev("; ".join(x["text"] for x in rest), **{k: v for x in rest for k, v in x.items() if k != "text"})
    return [lines[0], merged]


def _enough(side: dict[str, Any] | None) -> bool:
    return side is not None and side["n"] >= MIN_PER_SIDE


def _slice_sides(ctx: Context) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Gives the live requests in slices with batch traffic and in those without (None where
    there are none): counts and medians."""
    rows = {r["with_batch"]: r for r in ctx.query("diag_batch_mode", [ctx.slice_ns, ctx.slice_ns])}
    return rows[True], rows.get(False)


def _ratio_surely_below(first: dict[str, Any], measure: str) -> bool:
    """Says whether the ratio `_comparisons` reads for `measure` (median beside batch requests
    over the median apart) is surely below MIN_RATIO, from diag_batch_apart's counts."""
    apart = first[f"apart_{measure}_p50"]
    if apart is None or apart <= 0 or not first[f"beside_{measure}_n"]:
        return True  # `_ratio` gives 0
    return median_surely_below(first[f"beside_{measure}_below"], first[f"beside_{measure}_n"])


def _request_contrast_needed(ctx: Context, has_steps: bool) -> bool | None:
    """The first check on the request-level contrast, before its sweep (diag_batch_concurrency,
    5-8 CPU-s at 10 M requests) runs: None where the contrast surely gives no finding (live
    requests on both sides, and neither median beside batch requests reaches MIN_RATIO times
    the one apart), False where the finding will not read it (too few live requests on a side,
    and the engine's steps decide instead), True where only the sweep can tell."""
    first = ctx.one(
        "diag_batch_apart", [*ctx.instance_arrivals, MIN_RATIO * INSIDE, MIN_RATIO * INSIDE]
    )
    if first["reversed"]:
        return True  # a request that ends before it starts: only the sweep counts as the sweep does
    if first["apart_n"] >= MIN_PER_SIDE and first["beside_n"] >= MIN_PER_SIDE:
        if _ratio_surely_below(first, "ttft") and _ratio_surely_below(first, "tpot"):
            return None
        return True
    return not has_steps


def detect(ctx: Context) -> Finding | None:
    if (ctx.overview.get("classes") or 0) < 2:
        return None
    # the slices' sides are counted first and their medians read only where they are the
    # comparison or nothing request-level stands in: with batch traffic in every slice (10 M
    # requests) they were 2.5 CPU-s unread
    counts = slice_mix.batch_sides(ctx)
    if counts.get(True, 0) < MIN_PER_SIDE:
        return None
    under: dict[str, Any] | None = None
    alone: dict[str, Any] | None = None
    if counts.get(False, 0) >= MIN_PER_SIDE:
        under, alone = _slice_sides(ctx)
    lo, hi = ctx.time_bounds
    steps = ctx.one("diag_batch_steps", [lo, hi])  # steps of a known batch size only
    affected_query, affected_params = "affected_batch_mode", [ctx.slice_ns, ctx.slice_ns]
    who = "live requests while batch jobs run"
    by_request: dict[bool, dict[str, Any]] = {}
    if alone is None:
        # batch traffic in every slice: live requests that arrived with no batch request in
        # flight on their instance are the baseline, where there are enough of them
        needed = _request_contrast_needed(ctx, bool(steps.get("steps")))
        if needed is None:
            return None
        if needed:
            by_request = {r["with_batch"]: r for r in ctx.query("diag_batch_concurrency")}
        beside, apart = by_request.get(True), by_request.get(False)
        if beside is not None and apart is not None and _enough(beside) and _enough(apart):
            under, alone = beside, apart
            who = (
                "live requests that arrived while batch requests were in flight on their instance "
                f"({beside['in_flight_p50']:.0f} at the median)"
            )
            affected_query, affected_params = "affected_batch_concurrency", []
    if under is None:
        under, alone = _slice_sides(ctx)
    evidence = []
    if alone is not None and _enough(alone):
        tr = _ratio(under["ttft_p50"], alone["ttft_p50"])
        pr = _ratio(under["tpot_p50"], alone["tpot_p50"])
        gain = (under["ttft_p50"] or 0.0) - (alone["ttft_p50"] or 0.0)
        if max(tr, pr) < MIN_RATIO or (tr >= pr and gain < MIN_TTFT_GAIN_MS):
            return None
        evidence.extend(_comparisons(under, alone, tr >= pr, who))
        strength = (max(tr, pr) - MIN_RATIO) / 1.5
    elif steps.get("steps"):
        if (steps["batch_p50"] or 0) < LARGE_BATCH:
            return None
        evidence.append(
            ev(
                f"batch traffic never stops; live requests run in batches of {steps['batch_p50']:.0f} "
                f"(max {steps['batch_max']}), TTFT p50 {ms(under['ttft_p50'])}, TPOT p50 {ms(under['tpot_p50'])}",
                batch_p50=steps["batch_p50"], batch_max=steps["batch_max"],
                ttft_p50_ms=under["ttft_p50"], tpot_p50_ms=under["tpot_p50"],
            )
        )
        strength = (steps["batch_p50"] - LARGE_BATCH) / LARGE_BATCH
    else:
        # batch traffic never stops and the engine gives no batch size (vLLM, TGI's `infer`
        # steps): how many batch requests its instance held beside each live one stands in
        beside = by_request.get(True)
        if beside is None or not _enough(beside) or (beside["in_flight_p50"] or 0) < LARGE_BATCH:
            return None
        evidence.append(
            ev(
                f"batch traffic never stops; live requests arrived beside {beside['in_flight_p50']:.0f} "
                f"batch requests in flight on their instance (median; max {beside['in_flight_max']}), "
                f"TTFT p50 {ms(beside['ttft_p50'])}, TPOT p50 {ms(beside['tpot_p50'])}; the engine "
                "gives no batch sizes, so the requests in flight stand in for them",
                batch_in_flight_p50=beside["in_flight_p50"], batch_in_flight_max=beside["in_flight_max"],
                ttft_p50_ms=beside["ttft_p50"], tpot_p50_ms=beside["tpot_p50"], requests=beside["n"],
            )
        )
        strength = (beside["in_flight_p50"] - LARGE_BATCH) / LARGE_BATCH
        under = beside
        affected_query, affected_params = "affected_batch_concurrency", []
    if steps.get("steps"):
        evidence.append(
            ev(
                f"engine steps holding live requests: batch size p50 {steps['batch_p50']:.0f}, max {steps['batch_max']}",
                batch_p50=steps["batch_p50"], batch_max=steps["batch_max"],
            )
        )
    affected, examples = ctx.traces(ctx.query(affected_query, affected_params))
    total = float(ctx.overview.get("e2e_total") or 1.0)
    return Finding(
        COMPLAINT,
        min(0.99, confidence(strength, under["n"]) + 0.05),
        impact=(under["e2e_total"] or 0.0) / total + 0.3,
        evidence=evidence,
        affected_trace_ids=affected,
        affected_count=affected.total,
        example_traces=examples,
    )
