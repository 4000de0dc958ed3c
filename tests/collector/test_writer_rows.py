"""The writer's bulk row builders give exactly what the per-row definitions give."""

from __future__ import annotations

import random

from tokentrace.analyzer.summary import COLUMNS
from tokentrace.collector.writer import _columns, itl_histogram, itl_histograms
from tokentrace.store.schema import ITL_BUCKET_BOUNDS_MS


def test_bulk_itl_histograms_equal_bisect_per_gap() -> None:
    rng = random.Random(2)
    edges = list(ITL_BUCKET_BOUNDS_MS)
    gap_lists = [
        [rng.choice([0.0, rng.choice(edges), rng.expovariate(1 / 30), 1e6]) for _ in range(rng.randint(0, 90))]
        for _ in range(300)
    ] + [[]]
    assert itl_histograms(gap_lists) == [itl_histogram(g) for g in gap_lists]
    assert itl_histograms([]) == []


def test_request_columns_are_the_fields_in_column_order() -> None:
    class Row:
        def __init__(self, i: int) -> None:
            for c in COLUMNS:
                setattr(self, c, f"{c}-{i}")

    rows = [Row(i) for i in range(3)]
    assert _columns(rows) == [[getattr(r, c) for r in rows] for c in COLUMNS]  # type: ignore[arg-type]
