"""The `itl_rollup` rows of one writer transaction: its requests' ITL histograms summed
per minute of start, service, model, tenant and traffic class (docs/schema.md).

Summed here, from the rows the transaction inserts, so the rollup counts exactly what
`requests` and `itl_hist` hold: a report trusts a minute's rollup only where its
`requests` equal the stored requests of that minute (tokentrace.analyzer.itl_window).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import numpy as np
import pyarrow as pa

from tokentrace.analyzer.summary import RequestSummary
from tokentrace.store.schema import ROLLUP_NS, ROLLUP_SLICE


def rollup_table(requests: Sequence[RequestSummary], counts: Sequence[Sequence[int]]) -> pa.Table:
    """Gives one row per (minute, service, model, tenant, traffic class) of `requests`, with
    how many requests and the element-wise sum of their ITL `counts` (aligned with them)."""
    slice_of = attrgetter(*ROLLUP_SLICE)
    keys: dict[tuple[Any, ...], int] = {}
    group = np.empty(len(requests), dtype=np.int64)
    for i, r in enumerate(requests):
        key = (r.start_ns - r.start_ns % ROLLUP_NS, *slice_of(r))
        group[i] = keys.setdefault(key, len(keys))
    matrix = np.asarray(counts, dtype=np.int64).reshape(len(requests), -1)
    sums = np.zeros((len(keys), matrix.shape[1]), dtype=np.int64)
    np.add.at(sums, group, matrix)
    n = np.bincount(group, minlength=len(keys))
    columns: list[tuple[Any, ...]] = (
        list(zip(*keys, strict=True)) if keys else [()] * (1 + len(ROLLUP_SLICE))
    )
    return pa.table(
        {
            "minute_ns": pa.array(columns[0], pa.int64()),
            **{
                name: pa.array(col, pa.string())
                for name, col in zip(ROLLUP_SLICE, columns[1:], strict=True)
            },
            "requests": pa.array(n, pa.int64()),
            "counts": pa.array(sums.tolist(), pa.list_(pa.int64())),
        }
    )
