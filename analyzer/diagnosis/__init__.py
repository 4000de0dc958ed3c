"""The diagnosis: a window of requests in, findings in the complaint table's words out.

One module per signal (docs/design.md §5).  `diagnose` runs those the window's data can
check (`coverage.NEEDS`: never a complaint whose defining contrast the data lacks), drops
the ones that do not apply, and ranks the rest by confidence × impact.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import duckdb

from tokentrace.analyzer.diagnosis import (
    bad_in_production,
    batch_mode,
    big_tenants,
    cold_start,
    decode_batch,
    gpu_saturation,
    kv_cache,
    long_wait,
    peak_hours,
    stutter,
    tiny_prompts,
)
from tokentrace.analyzer.diagnosis._base import (
    FIX_FIRST,
    MIN_REQUESTS,
    TITLES,
    Context,
    Finding,
    pick_examples,
)
from tokentrace.analyzer.diagnosis.coverage import Signals, checks, read_signals

__all__ = ["COMPLAINTS", "FIX_FIRST", "SIGNALS", "TITLES", "Context", "Finding", "diagnose"]

logger = logging.getLogger("tokentrace.analyzer")

Signal = Callable[[Context], Finding | None]

SIGNALS: Sequence[tuple[str, Signal]] = (
    (peak_hours.COMPLAINT, peak_hours.detect),
    (bad_in_production.COMPLAINT, bad_in_production.detect),
    (batch_mode.COMPLAINT, batch_mode.detect),
    (big_tenants.COMPLAINT, big_tenants.detect),
    (long_wait.COMPLAINT, long_wait.detect),
    (stutter.COMPLAINT, stutter.detect),
    (tiny_prompts.COMPLAINT, tiny_prompts.detect),
    (cold_start.COMPLAINT, cold_start.detect),
    (gpu_saturation.COMPLAINT, gpu_saturation.detect),
    (kv_cache.COMPLAINT, kv_cache.detect),
)
COMPLAINTS: tuple[str, ...] = tuple(c for c, _ in SIGNALS)

#: A load-driven explanation makes "slow even for tiny prompts" a symptom, not the cause.
_SUBSUMED_BY = {
    tiny_prompts.COMPLAINT: (peak_hours.COMPLAINT, bad_in_production.COMPLAINT, gpu_saturation.COMPLAINT)
}
_SUBSUMED_FACTOR = 0.6
#: A server saturated throughout (peak_hours without quiet slices) is the symptom when one
#: of these names why the queue never empties: the GPU or the KV cache is the bottleneck,
#: one heavy tenant's work is what the rest wait behind.  Those lead; the saturation
#: stays visible below them.  (batch_mode_breaks_live: see `_one_story_per_queue`.)
_SATURATION_EXPLAINED_BY = (gpu_saturation.COMPLAINT, kv_cache.COMPLAINT, big_tenants.COMPLAINT)


def diagnose(ctx: Context, signals: Signals | None = None) -> list[dict[str, Any]]:
    """Gives the findings of the window, most important first (empty when healthy); only
    complaints its `signals` (read here when not given) can check are looked for."""
    if ctx.count < MIN_REQUESTS:
        return []
    checkable = {c.complaint for c in checks(signals or read_signals(ctx)) if c.checkable}
    found: list[Finding] = []
    for name, detect in SIGNALS:
        if name not in checkable:
            continue
        try:
            finding = detect(ctx)
        except duckdb.Error:
            # one signal's failure must not hide the others; it is logged with its query
            logger.exception("diagnosis signal %s failed", name)
            continue
        if finding is not None:
            found.append(finding)
    found = _one_story_per_queue(found)
    names = {f.complaint for f in found}
    for f in found:
        if any(other in names for other in _SUBSUMED_BY.get(f.complaint, ())):
            f.confidence = round(f.confidence * _SUBSUMED_FACTOR, 3)
        if f.basis == "saturated" and any(other in names for other in _SATURATION_EXPLAINED_BY):
            f.confidence = round(f.confidence * _SUBSUMED_FACTOR, 3)
    found.sort(key=lambda f: f.score, reverse=True)
    pick_examples(found)
    return [f.as_dict() for f in found]


def _one_story_per_queue(found: list[Finding]) -> list[Finding]:
    """Drops the second telling of one queue.  docs/design.md §5 gives `peak_hours` the time
    story (busy slices against the rest) and `bad_in_production` the environment story, so:

    - a `peak_hours` found without quiet slices (saturated throughout) is the same queue
      bad_in_production shows when it compares environments: production saturated,
      the other environment not.  That comparison is the better evidence (it says
      where), so the saturated finding is skipped;
    - the same for `batch_mode_breaks_live`: live requests that always wait while batch
      jobs share the engine wait for batching by design, and "add capacity" would be
      the wrong fix for it;
    - `tiny_prompts_slow` whose wait is the scheduler's, found with every prompt one size
      (no larger prompts to show the line is everyone's, `tiny_prompts.SCHEDULER_UNCOMPARED`),
      is that saturated queue seen from the smallest prompts: peak_hours found the queue
      dominating (nearly) every slice, with how many wait while how many are served
      (Little's law), which says the queue is load, as docs/report.md has it; so it is
      skipped rather than told twice, with "cap queue depth";
    - `stutter` that rests on decode steps slowing as the batch grows, beside
      `batch_mode_breaks_live`: the batch jobs are what fills the batch, and that finding
      says so with the fix that fits (`decode_batch.BASIS`).
    """
    by = {f.complaint: f for f in found}
    peak, prod = by.get(peak_hours.COMPLAINT), by.get(bad_in_production.COMPLAINT)
    drop: list[Finding] = []
    if peak is not None and prod is not None and peak.basis == "saturated":
        drop.append(peak)
    if peak is not None and peak.basis == "saturated" and batch_mode.COMPLAINT in by:
        drop.append(peak)
    tiny = by.get(tiny_prompts.COMPLAINT)
    if peak is not None and peak.basis == "saturated" and tiny is not None:
        if tiny.basis == tiny_prompts.SCHEDULER_UNCOMPARED:
            drop.append(tiny)
    slow = by.get(stutter.COMPLAINT)
    if slow is not None and slow.basis == decode_batch.BASIS and batch_mode.COMPLAINT in by:
        drop.append(slow)
    return [f for f in found if not any(f is d for d in drop)]

