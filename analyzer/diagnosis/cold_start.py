"""`cold_start`: the first requests of an instance (start, deploy, idle) pay initialization.

Cold requests are the SDK's marked ones, those that started during an engine start-up of
their instance or soon after it (`engine_starts`: vLLM's start-up trace, whose phases the
evidence names), and an instance's first request where the window shows several instances.
"""

from __future__ import annotations

import json
from typing import Any

from tokentrace._words import counted
from tokentrace.analyzer.diagnosis._base import (
    INSIDE,
    Context,
    Finding,
    confidence,
    ev,
    median_surely_above,
    ms,
)

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
#: A request that starts this soon after its instance's engine started is still cold: the
#: first batches after loading pay what loading left (allocations, kernels' first runs, a
#: gateway's backlog of requests that waited for the instance).
AFTER_START_NS = 30 * 10**9
#: The start-ups named in the evidence at most, and the phases named for each: vLLM's
#: informative ones first (the others wrap them), else the longest.
MAX_STARTS_SHOWN = 3
SHOWN_PHASES = ("Load weights", "Load model", "Allocate KV cache", "Prepare model")
MAX_PHASES_SHOWN = 3


def _contrast(cold_p50: float | None, warm_p50: float | None) -> tuple[float, float]:
    """Gives (ratio, gain) of the cold median wait over the warm one, as the finding reads them."""
    ratio = (cold_p50 or 0.0) / max(warm_p50 or 0.0, 1e-9)
    gain = (cold_p50 or 0.0) - (warm_p50 or 0.0)
    return ratio, gain


def _clears(cold_p50: float | None, warm_p50: float | None) -> bool:
    """Says whether the cold median is far enough above the warm one for a finding (a NaN
    median is not: it compares neither way)."""
    ratio, gain = _contrast(cold_p50, warm_p50)
    return ratio >= MIN_RATIO and gain >= MIN_GAIN_MS


def _may_fire(ctx: Context) -> bool:
    """The first check (diag_cold_first: the cold side exactly, the warm side counted, 0.22
    CPU-s at 10 M requests, 0.39 over a lake, against diag_cold_start's 0.58 and 0.82, the
    warm median most of it): False where `detect` surely finds nothing, True where only
    diag_cold_start can tell.  The counts rule the contrast out where more than half of the
    warm waits are above the bar: then the warm median is at least the lower middle wait,
    above the bar, and a warm median at or above the bar does not clear it where the bar itself
    does not (ratio and gain only fall as the warm median rises, in floats too, for a cold
    median above 0: the bar is checked here, in the reader's own arithmetic, not trusted)."""
    first = ctx.one(
        "diag_cold_first",
        [AFTER_START_NS, MIN_INSTANCES, MIN_RATIO * INSIDE, MIN_GAIN_MS * INSIDE],
    )
    if not first["cold_n"] or first["warm_n"] < MIN_WARM:
        return False
    if first["cold_instances"] < MIN_INSTANCES and first["cold_n"] < MIN_COLD_REQUESTS:
        return False
    cold_p50, bar = first["cold_wait_p50"], first["bar"]
    if (cold_p50 or 0.0) <= 0:
        return False  # a ratio of at most 0, whatever the warm median
    if bar is None or bar != bar or _clears(cold_p50, bar):
        return True  # a NaN median, or a bar drawn where it does not rule out
    return not median_surely_above(first["warm_above"], first["warm_waits"])


def detect(ctx: Context) -> Finding | None:
    if not _may_fire(ctx):
        return None
    rows = {r["cold"]: r for r in ctx.query("diag_cold_start", [AFTER_START_NS, MIN_INSTANCES])}
    cold, warm = rows.get(True), rows.get(False)
    if not cold or not warm or warm["n"] < MIN_WARM:
        return None
    if cold["instances"] < MIN_INSTANCES and cold["n"] < MIN_COLD_REQUESTS:
        return None
    if not _clears(cold["wait_p50"], warm["wait_p50"]):
        return None
    ratio, gain = _contrast(cold["wait_p50"], warm["wait_p50"])
    evidence = [
        ev(
            f"{counted(cold['n'], 'cold request')} on {counted(cold['instances'], 'instance')} "
            f"waited {ms(cold['wait_p50'])} "
            f"for the first token (p50) vs {ms(warm['wait_p50'])} once warm ({ratio:.1f}×)",
            cold_requests=cold["n"], instances=cold["instances"], cold_ttft_p50_ms=cold["wait_p50"],
            warm_ttft_p50_ms=warm["wait_p50"], ratio=ratio, after_start=cold["after_start"],
        )
    ]
    fix_lead = None
    if cold["after_start"]:
        starts = _starts(ctx)
        evidence += starts
        if starts:
            fix_lead = (
                "Send an instance no traffic until its engine has loaded and served a warm-up "
                f"request (a readiness check that waits for it): its start-up took {ms(starts[0]['startup_ms'])}"
            )
    affected, examples = ctx.traces(
        ctx.query("affected_cold_start", [AFTER_START_NS, MIN_INSTANCES])
    )
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
        fix_lead=fix_lead,
    )


def _phases(text: str) -> dict[str, float]:
    try:
        phases = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(phases, dict):
        return {}
    return {str(k): float(v) for k, v in phases.items() if isinstance(v, (int, float))}


def shown_phases(phases: dict[str, float]) -> list[tuple[str, float]]:
    """Gives the phases a start-up's evidence names: vLLM's informative ones where it has
    them, else its longest (the first is the whole start-up: said on its own)."""
    named = [(p, phases[p]) for p in SHOWN_PHASES if p in phases]
    if named:
        return named[:MAX_PHASES_SHOWN]
    rest = sorted(list(phases.items())[1:], key=lambda kv: -kv[1])
    return rest[:MAX_PHASES_SHOWN]


def _starts(ctx: Context) -> list[dict[str, Any]]:
    """Gives an evidence line per engine start-up behind the cold requests (the first few)."""
    lines = []
    for s in ctx.query("diag_engine_starts", [AFTER_START_NS])[:MAX_STARTS_SHOWN]:
        phases = _phases(s["phases"])
        took = (s["end_ns"] - s["start_ns"]) / 1e6
        said = ", ".join(f"{name} {ms(v)}" for name, v in shown_phases(phases))
        lines.append(
            ev(
                f"instance {s['instance']} started up in {ms(took)}"
                + (f" ({said})" if said else "")
                + f"; its {counted(s['requests'], 'request')} during that or in the "
                f"{AFTER_START_NS // 10**9} s after waited {ms(s['wait_p50'])} (p50)",
                instance=s["instance"], startup_ms=took, phases=phases, requests=s["requests"],
                wait_p50_ms=s["wait_p50"],
            )
        )
    return lines
