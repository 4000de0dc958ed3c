"""ITL histogram counts (the `itl_hist` rows) from inter-token gaps.

The bucket bounds are a parameter (the writer passes the schema's
`ITL_BUCKET_BOUNDS_MS`) so that decode workers compute the same counts
without importing the store, and with it DuckDB.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from itertools import chain

import numpy as np


def itl_histogram(gaps_ms: Sequence[float], bounds_ms: Sequence[float]) -> list[int]:
    """Gives gap counts over `bounds_ms` (+1 overflow bucket): gap g falls in the
    first bucket whose bound is >= g."""
    counts = [0] * (len(bounds_ms) + 1)
    for g in gaps_ms:
        counts[bisect.bisect_left(bounds_ms, g)] += 1
    return counts


def itl_histograms(
    gap_lists: Sequence[Sequence[float]], bounds_ms: Sequence[float]
) -> list[list[int]]:
    """`itl_histogram` of many requests at once: one searchsorted + bincount for
    the whole batch instead of a Python `bisect` per gap (~70 gaps a request)."""
    width = len(bounds_ms) + 1
    lengths = np.fromiter(map(len, gap_lists), dtype=np.int64, count=len(gap_lists))
    gaps = np.fromiter(chain.from_iterable(gap_lists), dtype=np.float64, count=int(lengths.sum()))
    bucket = np.searchsorted(np.asarray(bounds_ms, dtype=np.float64), gaps, side="left")
    row = np.repeat(np.arange(len(gap_lists), dtype=np.int64), lengths)
    counts = np.bincount(row * width + bucket, minlength=len(gap_lists) * width)
    return counts.reshape(len(gap_lists), width).tolist()  # type: ignore[no-any-return]
