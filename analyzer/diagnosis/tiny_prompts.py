"""`tiny_prompts_slow`: even small prompts spend most of their time on the wire or in line."""

from __future__ import annotations

from typing import Any

from tokentrace.analyzer.diagnosis._base import Context, Finding, confidence, ev, ms, pct

COMPLAINT = "tiny_prompts_slow"
#: A prompt is "tiny" in the bottom quarter of the window, and never above this.
MAX_TINY_TOKENS = 512
MIN_TINY = 20
#: network + queue must be the larger part of a tiny request, and noticeable in absolute terms
MIN_OVERHEAD_SHARE = 0.5
MIN_OVERHEAD_MS = 50.0
#: Queue-bound tiny prompts whose larger siblings queue at least this share as long: the
#: queue is load (peak_hours, bad_in_production, gpu_saturation tell which), not a
#: tiny-prompt problem; "slow even for tiny prompts" is about the wire and the gateway.
LOAD_QUEUE_RATIO = 0.5


def _load_driven(tiny: dict[str, Any], rest: dict[str, Any]) -> bool:
    """Says whether tiny prompts' queue is the scheduler's line that every prompt size stands in."""
    if (tiny["queue_split_total"] or 0.0) + (rest["queue_split_total"] or 0.0) > 0:
        # the queue is split into scheduler wait and the rest: a slow gateway is not load
        wait = tiny["queue_wait_p50"] or 0.0
        return wait >= 0.5 * (tiny["queue_p50"] or 0.0) and (rest["queue_wait_p50"] or 0.0) >= LOAD_QUEUE_RATIO * wait
    return (rest["queue_p50"] or 0.0) >= LOAD_QUEUE_RATIO * (tiny["queue_p50"] or 0.0)


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
    rest = rows.get(False)
    if where == "queue" and rest and rest["n"] >= MIN_TINY and _load_driven(tiny, rest):
        return None
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
    if rest and rest["n"]:
        evidence.append(
            ev(
                f"larger prompts: network + queue {pct(rest['overhead_share'])} of E2E, "
                f"median queue {ms(rest['queue_p50'])}",
                baseline_overhead_share=rest["overhead_share"], baseline_requests=rest["n"],
                baseline_queue_p50_ms=rest["queue_p50"],
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
