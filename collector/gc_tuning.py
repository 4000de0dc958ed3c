"""Garbage-collector settings for a long-running ingest process.

The tail buffer holds up to `max_buffered_spans` decoded spans (each a
GC-tracked object with dicts and lists), and the default gen-0 threshold
(700 allocations) makes CPython scan those young containers over and over:
measured on the realistic benchmark payloads, decode alone ran ~2x slower
with the default settings than with these.  Our data is acyclic (spans,
dicts, lists of scalars), so reference counting frees it; the cyclic
collector only has to catch the occasional cycle (exceptions, asyncio), and
doing that every 50 000 allocations instead of 700 bounds the extra memory to
a few MiB.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

#: (gen0, gen1, gen2) thresholds while ingesting.
INGEST_THRESHOLDS = (50_000, 50, 100)


def tune_for_ingest() -> Callable[[], None]:
    """Moves everything alive now (modules, apps) out of the collector's sight
    and raises the thresholds; gives the function that restores the defaults."""
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()  # start-up objects live forever: never scan them again
    gc.set_threshold(*INGEST_THRESHOLDS)

    def restore() -> None:
        gc.set_threshold(*previous)
        gc.unfreeze()

    return restore
