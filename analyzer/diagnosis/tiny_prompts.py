"""`tiny_prompts_slow`: even small prompts wait mostly on the wire or in line for their first token.

"Slow before inference starts" (docs/design.md §5) is judged on the user's wait for the first
token (TTFT as the client saw it, else network + the server's TTFT), not on E2E: a chat
answer streaming for seconds would otherwise dilute a 600 ms cross-region hop to a few
percent of E2E.  An absolute floor keeps a fast server near its users unflagged, however
large a share of a tiny TTFT its few milliseconds of network are.
"""

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

COMPLAINT = "tiny_prompts_slow"
#: A prompt is "tiny" in the bottom quarter of the window, and never above this.
MAX_TINY_TOKENS = 512
MIN_TINY = 20
#: network + queue must be the larger part of a tiny request's wait for its first token, and
#: past the 0.1 s a wait still feels instant in: a fast server near its users spends 5-30 ms
#: there (often most of a 40 ms TTFT), a cross-region hop 150 ms or more
MIN_OVERHEAD_SHARE = 0.5
MIN_OVERHEAD_MS = 100.0
#: Queue-bound tiny prompts whose larger siblings queue at least this share as long: the
#: queue is load (peak_hours, bad_in_production, gpu_saturation tell which), not a
#: tiny-prompt problem; "slow even for tiny prompts" is about the wire and the gateway.
LOAD_QUEUE_RATIO = 0.5
#: The fix for where the time goes, said before the complaint's generic fix: the network, or
#: the queue's largest part (`queue_part`) where the convention splits the queue; "queue" where
#: it does not.  "Cap queue depth" is no fix for a tokenizer that takes 300 ms with nobody
#: waiting, nor for a slow gateway.
FIX_LEAD = {
    "network": "Network is {part} of their {wait} wait for the first token: serve these users from a "
    "region near them, with no cross-region hop on the way (gateway, proxy, auth)",
    "queue": "The server's queue is {part} of their {wait} wait for the first token: look at what the "
    "gateway, middleware and "
    "tokenization spend on a small request, and at how long it waits for the scheduler",
    "queue_wait": "Waiting for the scheduler is {part} of their {wait} wait for the first token: look at "
    "how long the scheduler holds a request to fill a batch (its batch delay) and at how many "
    "requests wait ahead of a small one",
    "tokenize": "Tokenization is {part} of their {wait} wait for the first token, for prompts this "
    "small: use a fast (Rust) tokenizer, tokenize in more workers or off the serving loop "
    "(TGI --validation-workers), and cache the tokens of prompt prefixes many requests share",
    "other": "The server's time outside the scheduler and the tokenizer is {part} of their {wait} wait "
    "for the first token: look at what the gateway, auth and middleware spend on a small request",
}
#: How the evidence names each part of the queue.
QUEUE_PART_NAMES = {"queue_wait": "scheduler wait", "tokenize": "tokenization", "other": "the rest"}
#: The complaint's generic fix (FIX_FIRST), by the part of the wait each piece of it is for
#: ("queue": a queue the convention does not split).  A piece follows the lead only where
#: its part is at least REAL_PART_SHARE of the mean wait for the first token (no "cap queue
#: depth" for 2 ms of queue) and the lead has not said it.
FIX_THEN = {
    "network": "check the serving region against your users, kill cross-region hops",
    "queue": "cap queue depth",
    "queue_wait": "cap queue depth",
}
REAL_PART_SHARE = 0.2
#: `Finding.basis` of a finding whose wait is the scheduler's and that had no larger prompts
#: to tell load from a tiny-prompt problem with (every prompt one size): `diagnose` drops it
#: where peak_hours finds the server saturated, the load that fills any scheduler's line.
SCHEDULER_UNCOMPARED = "scheduler_wait_uncompared"


def _load_driven(tiny: dict[str, Any], rest: dict[str, Any]) -> bool:
    """Says whether tiny prompts' queue is the scheduler's line that every prompt size stands in."""
    if (tiny["queue_split_total"] or 0.0) + (rest["queue_split_total"] or 0.0) > 0:
        # the queue is split into scheduler wait and the rest: a slow gateway is not load
        wait = tiny["queue_wait_p50"] or 0.0
        return (
            wait >= 0.5 * (tiny["queue_p50"] or 0.0)
            and (rest["queue_wait_p50"] or 0.0) >= LOAD_QUEUE_RATIO * wait
        )
    return (rest["queue_p50"] or 0.0) >= LOAD_QUEUE_RATIO * (tiny["queue_p50"] or 0.0)


def detect(ctx: Context) -> Finding | None:
    # counts decide first: most windows stop there, and the figures (diag_tiny_prompts)
    # read every request
    first = ctx.one(
        "diag_tiny_prompts_share", [MAX_TINY_TOKENS, MIN_OVERHEAD_SHARE, MIN_OVERHEAD_MS]
    )
    n = int(first.get("n") or 0)
    if n < MIN_TINY or median_surely_below(first["below_share"], first["shares"]):
        return None
    if median_surely_below(first["below_overhead"], n):
        return None
    cut = int(first["cut_tokens"])
    rows = {r["tiny"]: r for r in ctx.query("diag_tiny_prompts", [cut])}
    tiny = rows.get(True)
    if not tiny:  # gone since the check (a live store's retention)
        return None
    share = tiny["overhead_share"] or 0.0
    overhead = tiny["overhead_p50"] or 0.0
    if share < MIN_OVERHEAD_SHARE or overhead < MIN_OVERHEAD_MS:
        return None
    # where the time goes, on one statistic: the sums over the tiny requests that spend at
    # least half their wait for the first token on network + queue (the requests the median
    # share speaks of); network + queue + compute is their wait, so the evidence adds up
    k = int(tiny["bound_n"] or 0)
    net_total, queue_total = float(tiny["bound_network_total"]), float(tiny["bound_queue_total"])
    where = "network" if net_total > queue_total else "queue"
    rest = rows.get(False)
    # the load check compares tiny prompts' scheduler wait with larger prompts': with every
    # prompt one size there are none, and `diagnose` asks peak_hours instead (SCHEDULER_UNCOMPARED)
    compared = rest is not None and rest["n"] >= MIN_TINY
    if where == "queue" and rest is not None and compared and _load_driven(tiny, rest):
        return None
    net_mean, queue_mean = net_total / max(k, 1), queue_total / max(k, 1)
    compute_mean = float(tiny["bound_compute_total"]) / max(k, 1)
    wait_mean = net_mean + queue_mean + compute_mean
    parts = _queue_parts(tiny, k, queue_mean)
    queue_part = max(parts, key=parts.__getitem__) if parts else None
    lead = "network" if where == "network" else (queue_part or "queue")
    network_text = (
        f"network {ms(net_mean)}" if tiny["bound_with_network"] else "network not measured"
    )
    evidence = [
        ev(
            f"for prompts of ≤ {cut} tokens, {k} of {counted(tiny['n'], 'request')} ({pct(k / tiny['n'])}) "
            f"spend at least half their wait for the first token on network + queue (median share "
            f"{pct(share)}; median network + queue {ms(overhead)} of a median {ms(tiny['wait_p50'])} wait, "
            f"median E2E {ms(tiny['e2e_p50'])})",
            prompt_tokens_max=cut,
            requests=tiny["n"],
            overhead_bound_requests=k,
            overhead_share=share,
            overhead_p50_ms=overhead,
            first_token_wait_p50_ms=tiny["wait_p50"],
            e2e_p50_ms=tiny["e2e_p50"],
            compute_p50_ms=tiny["compute_p50"],
        ),
        ev(
            (
                f"that request waits {ms(wait_mean)} for its first token: "
                if k == 1
                else f"those {k} wait {ms(wait_mean)} for their first token (mean): "
            )
            + f"{network_text} + queue {ms(queue_mean)} + compute {ms(compute_mean)}"
            + ("" if k == 1 else " (means)")
            + f"; most of it is {where}",
            where=where,
            overhead_bound_wait_mean_ms=wait_mean,
            overhead_bound_network_mean_ms=net_mean,
            overhead_bound_queue_mean_ms=queue_mean,
            overhead_bound_compute_mean_ms=compute_mean,
            network_p50_ms=tiny["network_p50"] or 0.0,
            queue_p50_ms=tiny["queue_p50"] or 0.0,
        ),
    ]
    if parts and queue_mean >= REAL_PART_SHARE * wait_mean:
        evidence.append(_queue_parts_line(parts, queue_mean, k))
    if rest and rest["n"]:
        evidence.append(
            ev(
                f"larger prompts ({counted(rest['n'], 'request')}): median share {pct(rest['overhead_share'])}, "
                f"median network + queue {ms(rest['overhead_p50'])}, median queue {ms(rest['queue_p50'])}",
                baseline_overhead_share=rest["overhead_share"],
                baseline_requests=rest["n"],
                baseline_overhead_p50_ms=rest["overhead_p50"],
                baseline_queue_p50_ms=rest["queue_p50"],
            )
        )
    affected, examples = ctx.traces(ctx.query("affected_tiny_prompts_slow", [cut]))
    # a share of a tiny TTFT is large easily (a few ms of compute): the sure cases are the ones
    # far past the floor, where the wait itself is long
    strength = (share - MIN_OVERHEAD_SHARE) / 0.4 + (overhead - MIN_OVERHEAD_MS) / 250.0
    total = sum((r["e2e_total"] or 0.0) for r in rows.values()) or 1.0
    return Finding(
        COMPLAINT,
        confidence(strength, tiny["n"]),
        # the window's E2E time that tiny prompts spend before inference starts
        impact=(tiny["before_total"] or 0.0) / total,
        evidence=evidence,
        affected_trace_ids=affected,
        affected_count=affected.total,
        example_traces=examples,
        fix_lead=FIX_LEAD[lead].format(
            part=ms(net_mean if lead == "network" else parts.get(lead, queue_mean)),
            wait=ms(wait_mean),
        ),
        fix_then=fix_then(
            lead, {"network": net_mean, **_queue_advice_part(parts, queue_mean)}, wait_mean
        ),
        basis=SCHEDULER_UNCOMPARED
        if where == "queue" and queue_part == "queue_wait" and not compared
        else None,
    )


def _queue_parts(tiny: dict[str, Any], k: int, queue_mean: float) -> dict[str, float]:
    """Gives the queue's part of the wait as its sub-parts (`QUEUE_PART_NAMES` keys, means over
    the `k` requests the split speaks of), {} where the convention does not split the queue
    (then all of it reads as "other", which would say nothing)."""
    if not (tiny["queue_split_total"] or 0.0):
        return {}
    queue_wait = float(tiny["bound_queue_wait_total"]) / max(k, 1)
    tokenize = float(tiny["bound_tokenize_total"]) / max(k, 1)
    return {
        "queue_wait": queue_wait,
        "tokenize": tokenize,
        "other": max(0.0, queue_mean - queue_wait - tokenize),
    }


def _queue_advice_part(parts: dict[str, float], queue_mean: float) -> dict[str, float]:
    """Gives the part of the queue that "cap queue depth" is for: the scheduler wait where the
    queue is split (a tokenizer or a gateway is not helped by a shorter line), else all of it."""
    return {"queue_wait": parts["queue_wait"]} if parts else {"queue": queue_mean}


def _queue_parts_line(parts: dict[str, float], queue_mean: float, k: int) -> dict[str, Any]:
    """Gives the evidence that says which part of the queue the wait is (the parts of the
    queue in the wait for the first token, largest first)."""
    ranked = sorted(parts, key=parts.__getitem__, reverse=True)
    share = {p: pct(parts[p] / max(queue_mean, 1e-9)) for p in ranked}
    # parts that read "0 % (0 ms)" say nothing: left out, but the largest is always said
    shown = [p for p in ranked if share[p] != "0 %"] or ranked[:1]
    said = ", ".join(f"{QUEUE_PART_NAMES[p]} {share[p]} ({ms(parts[p])})" for p in shown)
    whose = (
        f"its queue of {ms(queue_mean)}" if k == 1 else f"their queue of {ms(queue_mean)} (mean)"
    )
    return ev(
        f"{whose}: {said}; most of it is {QUEUE_PART_NAMES[ranked[0]]}",
        queue_part=ranked[0],
        overhead_bound_queue_wait_mean_ms=parts["queue_wait"],
        overhead_bound_tokenize_mean_ms=parts["tokenize"],
        overhead_bound_other_mean_ms=parts["other"],
    )


def fix_then(lead: str, parts_ms: dict[str, float], wait_ms: float) -> str:
    """Gives the generic advice that follows the lead (a FIX_LEAD key): the pieces for the parts
    of the wait (FIX_THEN keys) that are real and that the lead does not already cover; "" for
    none."""
    said: list[str] = []
    for part, advice in FIX_THEN.items():
        real = parts_ms.get(part, 0.0) >= REAL_PART_SHARE * wait_ms
        if real and not (part == "network" and lead == "network") and advice not in said:
            said.append(advice)
    return ", ".join(said)
