"""`stutter`, the decode that batching stretches: each decode step slows as the batch grows.

The stall signal (`stutter.py`) sees gaps against each stream's own median.  A stream that
is slow from its first token to its last, because every step decodes for thirty sequences,
has no gap above its median, and a window of TPOT five times the unloaded step read "no
latency complaint stands out".  This signal relates what a decode step costs to how many
sequences it decodes: engine steps that prefill nothing, their time at the smallest
batches against the largest; where no engine steps are recorded (vLLM's and SGLang's
spans carry none), TPOT against how many requests the server computed at once stands in.

Which row of the complaint table (docs/design.md §5): `stutter`, "decode is getting
interrupted", where the time goes to ITL and the fix first is "reduce decode batching".
The time is ITL here too, and that fix is this one.  `batch_mode_breaks_live`
("aggressive batching: TTFT and ITL stretched by design") is about batch traffic sharing
the engine with live traffic, and its fix (batch mode only where humans are not waiting)
has nothing to act on when every request is live; where it is found as well, the batch
jobs are what fills the batch, and `diagnose` keeps that finding alone (`BASIS`).  The
finding has its own title, since its streams slow down rather than freeze.
"""

from __future__ import annotations

from typing import Any

from tokentrace.analyzer.diagnosis._base import Context, Finding, confidence, ev, ms, pct

COMPLAINT = "stutter"
#: `Finding.basis` of this finding (`diagnose` tells one batching story once).
BASIS = "decode_batch"
TITLE = "It starts responding, then streams slowly: decode slows as the batch grows"
#: Engine steps that decode and prefill nothing, enough to compare batch sizes; steps (or,
#: counted from requests, streams) at each end of the comparison; streams with a TPOT.
MIN_DECODE_STEPS = 40
MIN_PER_SIDE = 10
MIN_STREAMS = 20
#: The largest batches decode at least this many times the sequences of the smallest (a
#: batch of 4 against one of 5 says nothing of what batching costs) ...
MIN_BATCH_RATIO = 2.0
#: ... and their steps (or, counted from requests, their TPOT) take at least this many times
#: as long.  A GPU's decode is memory-bound: batch 1 to 64 usually costs 1.2-1.6× per step,
#: which is what batching is for; twice as long is a step whose work grows with the batch.
MIN_STEP_RATIO = 2.0
#: The median stream must feel it: TPOT p50 at least this many times the unloaded step (or
#: the unloaded streams' TPOT) and this much longer.  10 → 16 ms a token still streams faster
#: than anyone reads; 20 → 104 ms, ten tokens a second, is what users call slow.
MIN_TPOT_STRETCH = 1.5
MIN_TPOT_GAIN_MS = 20.0
#: The generic fix without "reduce decode batching", which the lead already says.
FIX_THEN = "Separate long and short requests (long generations keep the batch full)."


def detect(ctx: Context) -> Finding | None:
    """Gives the finding where decode slows as the batch grows, None where it does not."""
    lo, hi = ctx.time_bounds
    svc = ctx.filters.service
    steps = ctx.one("diag_decode_batch_steps", [lo, hi, svc, svc])
    if int(steps.get("steps") or 0) >= MIN_DECODE_STEPS:
        # the engine says what each step cost: its word decides, whatever TPOT alone suggests
        return _from_steps(ctx, steps)
    tpot = _streams(ctx)
    if tpot is None or not _stretched(float(tpot["tpot_p50"]), float(tpot["tpot_p10"] or 0.0)):
        # the concurrency count reads every request: only where the median stream is
        # stretched past its fastest tenth could any quarter of them be past the bars
        return None
    return _from_concurrency(ctx, ctx.one("diag_decode_concurrency"), tpot)


def _streams(ctx: Context) -> dict[str, Any] | None:
    """Gives the window's streams' TPOT figures, None with too few streams to judge."""
    tpot = ctx.one("diag_decode_tpot")
    if int(tpot.get("streams") or 0) < MIN_STREAMS or tpot["tpot_p50"] is None:
        return None
    return tpot


def _stretched(tpot_p50: float, unloaded_ms: float) -> bool:
    """Says whether the median stream is slow enough against the unloaded time per token to
    be noticed (MIN_TPOT_STRETCH, MIN_TPOT_GAIN_MS)."""
    return tpot_p50 >= MIN_TPOT_STRETCH * unloaded_ms and tpot_p50 - unloaded_ms >= MIN_TPOT_GAIN_MS


def _grows(small: Any, large: Any, small_batch: Any, large_batch: Any) -> float:
    """Gives how many times longer the large batches take (0 where the sides cannot be
    compared: no figures, or batches too alike to say what batching costs)."""
    if small is None or large is None or not small_batch or large_batch is None:
        return 0.0
    if large_batch < MIN_BATCH_RATIO * small_batch or small <= 0:
        return 0.0
    return float(large) / float(small)


def _from_steps(ctx: Context, s: dict[str, Any]) -> Finding | None:
    if min(int(s["small_steps"] or 0), int(s["large_steps"] or 0)) < MIN_PER_SIDE:
        return None
    small, large = s["small_step_p50"], s["large_step_p50"]
    ratio = _grows(small, large, s["small_batch_max"], s["large_batch_min"])
    if ratio < MIN_STEP_RATIO:
        return None  # before reading every request's TPOT: most windows end here
    tpot = _streams(ctx)
    if tpot is None or not _stretched(float(tpot["tpot_p50"]), float(small)):
        return None
    small_batches = _batches(s["small_batch_min"], s["small_batch_max"])
    large_batches = _batches(s["large_batch_min"], s["large_batch_max"])
    slope = s["ms_per_sequence"]
    per_sequence = (
        f": each sequence in the batch adds about {slope:.1f} ms to a step"
        if slope and slope > 0
        else ""
    )
    evidence = [
        ev(
            f"decode steps take {ms(small)} at batch {small_batches} vs {ms(large)} at batch {large_batches} "
            f"({ratio:.1f}×; medians of {s['small_steps']} and {s['large_steps']} steps that prefilled "
            f"nothing){per_sequence}",
            small_batch_step_p50_ms=small,
            large_batch_step_p50_ms=large,
            step_ratio=ratio,
            small_batch_min=s["small_batch_min"],
            small_batch_max=s["small_batch_max"],
            large_batch_min=s["large_batch_min"],
            large_batch_max=s["large_batch_max"],
            small_batch_steps=s["small_steps"],
            large_batch_steps=s["large_steps"],
            ms_per_sequence=slope,
            decode_steps=s["steps"],
        ),
        _tpot_line(tpot, float(small), f"the {ms(small)} a step takes at batch {small_batches}"),
    ]
    lead = (
        f"Cap the decode batch where streaming speed matters: a step takes {ms(large)} at "
        f"{large_batches} sequences against {ms(small)} at {small_batches}"
    )
    return _finding(ctx, tpot, float(small), ratio, evidence, lead)


def _from_concurrency(ctx: Context, c: dict[str, Any], tpot: dict[str, Any]) -> Finding | None:
    if min(int(c.get("small_streams") or 0), int(c.get("large_streams") or 0)) < MIN_PER_SIDE:
        return None
    small, large = c["small_tpot_p50"], c["large_tpot_p50"]
    ratio = _grows(small, large, c["small_running_max"], c["large_running_min"])
    if ratio < MIN_STEP_RATIO or not _stretched(float(tpot["tpot_p50"]), float(small)):
        return None
    fewest = _batches(c["small_running_min"], c["small_running_max"])
    most = _batches(c["large_running_min"], c["large_running_max"])
    evidence = [
        ev(
            f"streams decoded while the server computed {most} requests at once get a token every "
            f"{ms(large)} vs {ms(small)} with {fewest} ({ratio:.1f}×; TPOT medians of "
            f"{c['large_streams']} and {c['small_streams']} streams); no engine steps were recorded, so the "
            "batch is counted from the requests' own times",
            small_running_min=c["small_running_min"],
            small_running_max=c["small_running_max"],
            large_running_min=c["large_running_min"],
            large_running_max=c["large_running_max"],
            small_running_tpot_p50_ms=small,
            large_running_tpot_p50_ms=large,
            tpot_ratio=ratio,
            small_running_streams=c["small_streams"],
            large_running_streams=c["large_streams"],
        ),
        _tpot_line(
            tpot,
            float(small),
            f"the {ms(small)} of streams decoded while it computed {fewest} at once",
        ),
    ]
    lead = (
        f"Cap the decode batch where streaming speed matters: a stream takes {ms(large)} a token "
        f"while the server computes {most} requests at once against {ms(small)} at {fewest}"
    )
    return _finding(ctx, tpot, float(small), ratio, evidence, lead)


def _batches(lo: Any, hi: Any) -> str:
    """Gives a range of batch sizes as the evidence says it: '4', '1–4'."""
    return f"{lo}" if lo == hi else f"{lo}–{hi}"


def _tpot_line(tpot: dict[str, Any], unloaded_ms: float, against: str) -> dict[str, Any]:
    """Gives the evidence that the median stream feels it: TPOT p50 against the unloaded time
    per token, and how much of E2E decoding is."""
    p50 = float(tpot["tpot_p50"])
    return ev(
        f"streams get a token every {ms(p50)} (TPOT p50), {p50 / unloaded_ms:.1f}× {against}; "
        f"decode is {pct(tpot['decode_share'])} of all E2E time",
        tpot_p50_ms=p50,
        unloaded_tpot_ms=unloaded_ms,
        tpot_stretch=p50 / unloaded_ms,
        decode_share=tpot["decode_share"],
        streams=tpot["streams"],
    )


def _finding(
    ctx: Context,
    tpot: dict[str, Any],
    unloaded_ms: float,
    ratio: float,
    evidence: list[dict[str, Any]],
    lead: str,
) -> Finding:
    p50 = float(tpot["tpot_p50"])
    stretch = p50 / unloaded_ms
    # the streams the batch stretched past what a reader notices, slowest first
    affected, examples = ctx.traces(
        ctx.query("affected_decode_batch", [MIN_TPOT_STRETCH * unloaded_ms])
    )
    strength = (ratio - MIN_STEP_RATIO) + (stretch - MIN_TPOT_STRETCH)
    return Finding(
        COMPLAINT,
        confidence(strength, int(tpot["streams"])),
        # the share of all E2E time the batch adds: decode's share, less what unloaded
        # steps would have taken of it
        impact=float(tpot["decode_share"] or 0.0) * (1.0 - unloaded_ms / p50),
        evidence=evidence,
        affected_trace_ids=affected,
        affected_count=affected.total,
        example_traces=examples,
        fix_lead=(
            f"{lead}; a lower limit on running sequences (vLLM --max-num-seqs, SGLang "
            "--max-running-requests, TGI --max-batch-size) trades throughput for a faster stream, "
            "and more replicas serve the rest"
        ),
        fix_then=FIX_THEN,
        title=TITLE,
        basis=BASIS,
    )
