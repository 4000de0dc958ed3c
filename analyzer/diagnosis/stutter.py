"""`stutter`: decode is interrupted; streams freeze, often while large prefills run beside them.

The symptom is read from the streams' own gaps (the server's token times, else the client's
chunk events).  The cause is looked for in the engine's steps where it sends them (a step
that prefilled many tokens inside the stream's decode), else in the requests themselves:
another request on the same instance whose prefill ran while the stream decoded, which a
prefill run whole (not chunked) does to every stream beside it.  Decode that slows as the
batch grows maps onto this complaint too (`decode_batch`).
"""

from __future__ import annotations

from typing import Any

from tokentrace._words import counted
from tokentrace.analyzer.diagnosis import decode_batch
from tokentrace.analyzer.diagnosis._base import Context, Finding, confidence, ev, ms, pct
from tokentrace.analyzer.itl import STALL_FACTOR, STALL_MIN_MS

COMPLAINT = "stutter"
MIN_STREAMS = 20
MIN_STALLED_FRACTION = 0.08
#: an engine step's prefill (its tokens summed over the requests it prefills) is "large" at
#: the window's p90 of those sums, or half the largest when that is lower, never below this
MIN_LARGE_PREFILL_TOKENS = 256
#: How the evidence says where the bar for a large prefill came from (`large_prefill_basis`).
LARGE_PREFILL_BASIS = {
    "p90": "the top tenth of this window's step prefills",
    "half_max": "half the largest step prefill of this window",
    "floor": f"a floor of {MIN_LARGE_PREFILL_TOKENS} tokens: this window's own bar is lower",
}
#: stalled streams must overlap large prefills this much more often than smooth ones to count as linked
MIN_PREFILL_LINK = 0.15
#: Engine steps seen but no prefill link: gaps a few times the typical one are what CPU
#: contention, GC or a noisy neighbour give a healthy server, so only a freeze a user
#: cannot miss (longest gap this many times the typical gap, and this long) is stutter.
UNLINKED_MIN_GAP_FACTOR = 10.0
UNLINKED_MIN_GAP_MS = 200.0
#: A stream with a client span is placed on the engine's clock by the last step that names
#: it, looked for where its last token can be on the client's clock: this much either side
#: allows for the two hosts' clocks disagreeing (NTP keeps them within a few ms).
STEP_CLOCK_SLACK_NS = 100_000_000
#: Without steps, another request's prefill counts as a cause of a freeze when it lasted at
#: least this share of the stalled streams' typical longest gap (a freeze as long as the
#: prefill that caused it is what a prefill run whole gives), and at least a stall's length.
PREFILL_SHARE_OF_STALL = 0.5


def _severe(r: dict[str, Any]) -> bool:
    """Says whether stalled streams froze long enough to be stutter without a known cause."""
    longest = float(r.get("stalled_max_p50") or 0.0)
    typical = float(r.get("itl_p50") or 0.0)
    return longest >= UNLINKED_MIN_GAP_MS and longest >= UNLINKED_MIN_GAP_FACTOR * typical


def detect(ctx: Context) -> Finding | None:
    """Gives the stutter finding: streams that froze (`_stalls`), or decode that slows as the
    batch grows (`decode_batch`), the one the other's evidence joins where both are found."""
    stalls, slowdown = _stalls(ctx), decode_batch.detect(ctx)
    if stalls is None or slowdown is None:
        return stalls or slowdown
    # freezes have a cause of their own with its own fix, so they lead and keep their rank;
    # the slowdown says why the streams are slow between them, and the generic fix (reduce
    # decode batching) fits it.  (Its larger impact would lift the finding above
    # batch_mode_breaks_live, where batch jobs are what fills the batch.)
    stalls.evidence.extend(slowdown.evidence)
    return stalls


def _stalls(ctx: Context) -> Finding | None:
    """Gives the finding where streams froze: gaps far above each stream's median, beside
    large prefills of their engine, or long enough to be stutter without a known cause."""
    # the counts decide first: most windows have too few frozen streams, and the medians
    # (diag_stutter) read every stream
    counts = ctx.one("diag_stutter_streams")
    n = int(counts.get("n") or 0)
    if n < MIN_STREAMS:
        return None
    stalled = int(counts["stalled"] or 0)
    frac = stalled / n
    if frac < MIN_STALLED_FRACTION:
        return None
    r = ctx.one("diag_stutter")
    evidence = [
        ev(
            f"{pct(frac)} of streams froze at least once (a gap > {STALL_FACTOR:.0f}× the stream's "
            f"median and ≥ {STALL_MIN_MS:.0f} ms); the typical gap is {ms(r['itl_p50'])}, stalled "
            f"streams' longest gap p50 {ms(r['stalled_max_p50'])}",
            stalled_fraction=frac,
            streams=n,
            stalled=stalled,
            itl_p50_ms=r["itl_p50"],
            stalled_itl_max_p50_ms=r["stalled_max_p50"],
            itl_max_p95_ms=r["itl_max_p95"],
        )
    ]
    strength = (frac - MIN_STALLED_FRACTION) / 0.1
    lo, hi = ctx.time_bounds
    svc = ctx.filters.service
    steps = ctx.one("diag_step_prefill", [lo, hi, svc, svc])
    linked = False
    fix_lead = None
    if not steps.get("steps"):
        overlap = _prefills_beside(ctx, r)
        if overlap is not None:
            line, gain, linked = overlap
            evidence.append(line)
            strength += gain
            if linked:
                fix_lead = prefill_beside_fix(
                    line.get("prompt_tokens_p50"), line.get("prefill_p50_ms")
                )
            elif not line.get("stalled_with_long_prefill") and not line.get(
                "smooth_with_long_prefill"
            ):
                # no other request's prefill ran beside any stall: the engine's batching is not
                # what the evidence points at, so the advice must not lead with it
                fix_lead = OUTSIDE_ENGINE_FIX
    else:
        large, basis = large_prefill(int(steps["p90"] or 0), int(steps["max"] or 0))
        slack = STEP_CLOCK_SLACK_NS
        rows = {
            x["stalled"]: x for x in ctx.query("diag_stutter_steps", [slack, slack, large, lo, hi])
        }
        s, smooth = rows.get(True), rows.get(False)
        if s and smooth and s["n"] and smooth["n"]:
            fs, fm = s["overlapped"] / s["n"], smooth["overlapped"] / smooth["n"]
            evidence.append(
                ev(
                    f"{pct(fs)} of stalled streams decoded while their engine ran a step that prefilled "
                    f"≥ {large} tokens (summed over the step's requests; {LARGE_PREFILL_BASIS[basis]}) "
                    f"vs {pct(fm)} of smooth streams",
                    stalled_with_large_prefill=fs,
                    smooth_with_large_prefill=fm,
                    large_prefill_tokens=large,
                    large_prefill_basis=basis,
                )
            )
            strength += max(0.0, (fs - fm) / 0.3)
            linked = fs - fm >= MIN_PREFILL_LINK
            fix_lead = chunked_prefill_fix(large) if linked else None
        if not linked and not _severe(r):
            # the engine shows no large prefill behind the stalls: mild gaps are load, not stutter
            return None
    affected, examples = ctx.traces(ctx.query("affected_stutter"))
    return Finding(
        COMPLAINT,
        confidence(strength, n),
        impact=max(frac, float(r["stalled_decode_share"] or 0.0)),
        evidence=evidence,
        affected_trace_ids=affected,
        affected_count=affected.total,
        example_traces=examples,
        fix_lead=fix_lead,
    )


def _prefills_beside(ctx: Context, r: dict[str, Any]) -> tuple[dict[str, Any], float, bool] | None:
    """Gives, without engine steps, the evidence line of other requests' prefills run on the
    stalled streams' instances while they decoded (against smooth streams), what it adds to
    the finding's strength, and whether it links the stalls to them; None where no stream
    could be compared."""
    bar = max(STALL_MIN_MS, PREFILL_SHARE_OF_STALL * float(r.get("stalled_max_p50") or 0.0))
    rows = {
        x["stalled"]: x for x in ctx.query("diag_stutter_overlap", [bar, MIN_LARGE_PREFILL_TOKENS])
    }
    s, smooth = rows.get(True), rows.get(False)
    if not s or not smooth or not s["n"] or not smooth["n"]:
        return None
    fs, fm = s["overlapped"] / s["n"], smooth["overlapped"] / smooth["n"]
    tokens = s["prompt_tokens_p50"]
    took = s["prefill_p50"]
    about = f"p50 {ms(took)}" + (f", prompts p50 {tokens:.0f} tokens" if tokens is not None else "")
    if fs or fm:
        text = (
            f"no engine steps in this window, so requests stand in: {pct(fs)} of stalled streams "
            f"were decoding while another request's prefill of ≥ {ms(bar)} ran on their instance "
            f"vs {pct(fm)} of smooth streams"
            + (f" ({counted(s['prefills'], 'such prefill')}: {about})" if s["prefills"] else "")
        )
    else:
        text = (
            f"no engine steps in this window, and no other request's prefill of ≥ {ms(bar)} (of a "
            f"prompt of ≥ {MIN_LARGE_PREFILL_TOKENS} tokens) ran on a stalled stream's instance while "
            "it decoded: the freezes have another cause (the host, the network, the client)"
        )
    line = ev(
        text,
        stalled_with_long_prefill=fs,
        smooth_with_long_prefill=fm,
        long_prefill_ms=bar,
        prefills=s["prefills"],
        prefill_p50_ms=took,
        prompt_tokens_p50=tokens,
    )
    return line, max(0.0, (fs - fm) / 0.3), fs - fm >= MIN_PREFILL_LINK


#: The fix when, without engine steps, no other request's prefill ran beside any stall.
OUTSIDE_ENGINE_FIX = (
    "Look outside the engine first: no other request's prefill ran beside the stalls, so check "
    "the host's CPU (other processes, throttling), the network between client and server, and "
    "how the client reads the stream; add the SDK's engine steps (tt.engine_step) to see the "
    "engine's own steps"
)


def prefill_beside_fix(prompt_tokens: float | None, prefill_ms: float | None) -> str:
    """Gives the fix when, without engine steps, stalls come with other requests' prefills."""
    what = (
        f"the ~{prompt_tokens:.0f}-token prompts"
        if prompt_tokens is not None
        else f"the prompts (prefills of ~{ms(prefill_ms)})"
    )
    return (
        f"Enable chunked prefill, with a per-step token budget well below {what} whose prefills "
        "ran whole beside the stalled streams (vLLM --enable-chunked-prefill and a smaller "
        "--max-num-batched-tokens, SGLang --chunked-prefill-size, TGI --max-batch-prefill-tokens)"
    )


def large_prefill(p90: int, largest: int) -> tuple[int, str]:
    """Gives the tokens from which an engine step's prefill is large, and where that bar
    comes from (a `LARGE_PREFILL_BASIS` key): the window's p90 of step prefills, or half its
    largest when that is lower (with a few big prompts the p90 lands on the very biggest, and
    a 1,200-token prefill that froze streams for 200 ms would count as smooth beside a
    2,000-token one), never below MIN_LARGE_PREFILL_TOKENS."""
    half = largest // 2
    bar, basis = (half, "half_max") if 0 < half < p90 else (p90, "p90")
    if bar < MIN_LARGE_PREFILL_TOKENS:
        return MIN_LARGE_PREFILL_TOKENS, "floor"
    return bar, basis


def chunked_prefill_fix(large_tokens: int) -> str:
    """Gives the fix when stalls come with large prefills run whole beside the decodes."""
    return (
        f"Enable chunked prefill, with a per-step token budget well below the ≥ {large_tokens}-token "
        "prefill steps that ran beside the stalled streams (vLLM --enable-chunked-prefill and a smaller "
        "--max-num-batched-tokens, SGLang --chunked-prefill-size, TGI --max-batch-prefill-tokens)"
    )
