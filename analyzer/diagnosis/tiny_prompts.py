"""`tiny_prompts_slow`: even small prompts spend most of their time on the wire or in line."""

from __future__ import annotations

from tokentrace.analyzer.diagnosis._base import Context, Finding, confidence, ev, ms, pct

COMPLAINT = "tiny_prompts_slow"
#: A prompt is "tiny" in the bottom quarter of the window, and never above this.
MAX_TINY_TOKENS = 512
MIN_TINY = 20
#: network + queue must be the larger part of a tiny request, and noticeable in absolute terms
MIN_OVERHEAD_SHARE = 0.5
MIN_OVERHEAD_MS = 50.0


def detect(ctx: Context) -> Finding | None:
    rows = {r["tiny"]: r for r in ctx.query("diag_tiny_prompts", [MAX_TINY_TOKENS])}
    tiny = rows.get(True)
    if not tiny or tiny["n"] < MIN_TINY:
        return None
    share = tiny["overhead_share"] or 0.0
    overhead = tiny["overhead_p50"] or 0.0
    if share < MIN_OVERHEAD_SHARE or overhead < MIN_OVERHEAD_MS:
        return None
    cut = int(tiny["cut_tokens"])
    network, queue = tiny["network_p50"] or 0.0, tiny["queue_p50"] or 0.0
    where = "network" if network > queue else "queue"
    evidence = [
        ev(
            f"for prompts of ≤ {cut} tokens, network + queue is {pct(share)} of E2E "
            f"(median {ms(overhead)} of {ms(tiny['e2e_p50'])}); compute takes only {ms(tiny['compute_p50'])}",
            prompt_tokens_max=cut, requests=tiny["n"], overhead_share=share,
            overhead_p50_ms=overhead, e2e_p50_ms=tiny["e2e_p50"], compute_p50_ms=tiny["compute_p50"],
        ),
        ev(
            f"median network {ms(network)}, median queue {ms(queue)}: most of it is {where}",
            network_p50_ms=network, queue_p50_ms=queue,
        ),
    ]
    rest = rows.get(False)
    if rest and rest["n"]:
        evidence.append(
            ev(
                f"larger prompts: network + queue {pct(rest['overhead_share'])} of E2E",
                baseline_overhead_share=rest["overhead_share"], baseline_requests=rest["n"],
            )
        )
    affected, examples = ctx.traces(ctx.query("affected_tiny_prompts_slow", [cut]))
    strength = (share - MIN_OVERHEAD_SHARE) / 0.2 + min(1.0, overhead / 500.0)
    total = sum((r["e2e_total"] or 0.0) for r in rows.values()) or 1.0
    return Finding(
        COMPLAINT,
        confidence(strength, tiny["n"]),
        impact=share * (tiny["e2e_total"] or 0.0) / total,
        evidence=evidence,
        affected_trace_ids=affected,
        example_traces=examples,
    )
