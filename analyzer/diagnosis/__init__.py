"""The diagnosis: a window of requests in, findings in the complaint table's words out.

One module per signal (DESIGN.md §5).  `diagnose` runs them all, drops the
ones that do not apply, and ranks the rest by confidence × impact.
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
from tokentrace.analyzer.filters import Filters

__all__ = ["COMPLAINTS", "FIX_FIRST", "SIGNALS", "TITLES", "Finding", "diagnose"]

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


def diagnose(conn: duckdb.DuckDBPyConnection, filters: Filters | None = None) -> list[dict[str, Any]]:
    """Gives the findings of the window, most important first (empty when healthy)."""
    ctx = Context(conn, filters or Filters())
    if ctx.count < MIN_REQUESTS:
        return []
    found: list[Finding] = []
    for name, detect in SIGNALS:
        try:
            finding = detect(ctx)
        except duckdb.Error:
            # one signal's failure must not hide the others; it is logged with its query
            logger.exception("diagnosis signal %s failed", name)
            continue
        if finding is not None:
            found.append(finding)
    names = {f.complaint for f in found}
    for f in found:
        if any(other in names for other in _SUBSUMED_BY.get(f.complaint, ())):
            f.confidence = round(f.confidence * _SUBSUMED_FACTOR, 3)
    found.sort(key=lambda f: f.score, reverse=True)
    pick_examples(found)
    return [f.as_dict() for f in found]
