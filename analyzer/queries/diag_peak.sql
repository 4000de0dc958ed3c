-- Per time slice (? ns): requests, their queue and E2E time, and their E2E count and range.
-- peak_hours.py adds the slices up into the busiest against the rest, and counts the two
-- sides' E2E percentiles from the slices (quantiles.py, `part_of`): looking each request's
-- slice up in the list of the busiest cost more than these sums (0.23 CPU-s at 10 M
-- requests against ~0.1), and a median per side 0.75 CPU-s.
-- Read where diag_slice_mix has too many rows (slice_mix.per_slice adds it up from that
-- pass otherwise, held to this query by tests/analyzer/test_slice_mix.py).
SELECT
    start_ns // ?                                               AS slice,
    count(*)                                                    AS n,
    sum(queue_ms)                                               AS queue_total,
    sum(e2e_ms)                                                 AS e2e_total,
    count(e2e_ms)                                               AS e2e_n,
    min(e2e_ms)                                                 AS e2e_min,
    max(e2e_ms)                                                 AS e2e_max
FROM req
GROUP BY slice
