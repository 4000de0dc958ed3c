"""`long_wait_then_fast`: prefill is expensive; the first token is late, the rest streams fast."""

from __future__ import annotations

from typing import Any

from tokentrace._words import counted
from tokentrace.analyzer.diagnosis._base import (
    Context,
    Finding,
    confidence,
    ev,
    median_surely_below,
    ms,
    pct,
)

COMPLAINT = "long_wait_then_fast"
MIN_REQUESTS = 20
MIN_TTFT_MS = 250.0
#: the wait must be mostly prefill (not queue), and long against one decode step
MIN_PREFILL_SHARE_OF_TTFT = 0.5
MIN_TTFT_PER_TPOT = 10.0


def _grows_with_prompt(r: dict[str, Any], corr: float | None) -> bool:
    """Says whether the window shows TTFT growing with prompt size: prompts of more than one
    size (the quartiles differ), longer ones waiting longer, and a positive correlation.
    With one prompt size there is nothing to compare, and a negative correlation says the
    opposite of the sentence."""
    long_tokens, short_tokens = r["long_tokens"], r["short_tokens"]
    long_p50, short_p50 = r["ttft_long_p50"], r["ttft_short_p50"]
    if long_tokens is None or short_tokens is None or long_p50 is None or short_p50 is None:
        return False
    return long_tokens > short_tokens and long_p50 > short_p50 and corr is not None and corr > 0


def detect(ctx: Context) -> Finding | None:
    # sums and counts decide first: most windows wait on the queue or the wire, or not long,
    # and the medians (diag_prefill) read every request's TTFT
    first = ctx.one("diag_prefill_share", [MIN_TTFT_MS])
    n = int(first.get("n") or 0)
    if n < MIN_REQUESTS or (first["prefill_share_of_ttft"] or 0.0) < MIN_PREFILL_SHARE_OF_TTFT:
        return None
    if median_surely_below(first["below_ttft"], n):
        return None
    r = ctx.one("diag_prefill")
    n = int(r.get("n") or 0)
    ttft, tpot = r["ttft_p50"] or 0.0, r["tpot_p50"]
    share = r["prefill_share_of_ttft"] or 0.0
    if ttft < MIN_TTFT_MS or share < MIN_PREFILL_SHARE_OF_TTFT:
        return None
    if tpot is not None and ttft < MIN_TTFT_PER_TPOT * tpot:
        return None
    # requests without a first token, or seen only by their client, are left out: where there
    # are any, the figures are not the window's (the report's tables) and say so
    whose = (
        ""
        if n >= ctx.count
        else f"{n} of {counted(ctx.count, 'request')} (those with a first token the server saw): "
    )
    evidence = [
        ev(
            f"{whose}TTFT p50 {ms(ttft)} (p90 {ms(r['ttft_p90'])}), {pct(share)} of it prefill; "
            f"prefill is {pct(r['prefill_share'])} of {'their' if whose else 'all'} E2E time",
            ttft_p50_ms=ttft,
            ttft_p90_ms=r["ttft_p90"],
            prefill_share_of_ttft=share,
            prefill_share=r["prefill_share"],
            requests=n,
        ),
    ]
    if tpot is not None:
        evidence.append(
            ev(
                f"after the first token it streams at {ms(tpot)} per token: the wait is {ttft / max(tpot, 1e-9):.0f}× one decode step",
                tpot_p50_ms=tpot,
                ttft_per_tpot=ttft / max(tpot, 1e-9),
            )
        )
    corr = r["prompt_ttft_corr"]
    if _grows_with_prompt(r, corr):
        evidence.append(
            ev(
                f"TTFT grows with prompt size: p50 {ms(r['ttft_long_p50'])} for prompts ≥ {r['long_tokens']} "
                f"tokens vs {ms(r['ttft_short_p50'])} for ≤ {r['short_tokens']} (correlation {corr:.2f})",
                ttft_long_p50_ms=r["ttft_long_p50"],
                ttft_short_p50_ms=r["ttft_short_p50"],
                long_prompt_tokens=r["long_tokens"],
                short_prompt_tokens=r["short_tokens"],
                prompt_ttft_corr=corr,
            )
        )
    affected, examples = ctx.traces(ctx.query("affected_long_wait_then_fast", [MIN_TTFT_MS]))
    strength = (share - MIN_PREFILL_SHARE_OF_TTFT) / 0.2 + min(1.0, ttft / 1000.0)
    strength += max(0.0, corr or 0.0)
    return Finding(
        COMPLAINT,
        confidence(strength, n),
        impact=r["prefill_share"] or 0.0,
        evidence=evidence,
        affected_trace_ids=affected,
        affected_count=affected.total,
        example_traces=examples,
    )
