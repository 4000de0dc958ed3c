-- Per time slice (? ns): arrivals, and whether the slice is among the busiest tenth.
-- Arrival rate counts the traffic class given (NULL: all) so batch floods don't mask it.
-- Read where diag_slice_mix has too many rows (slice_mix.busy_split adds it up from that
-- pass otherwise, held to this query by tests/analyzer/test_slice_mix.py).
WITH s AS (
    SELECT start_ns // ? AS slice, count(*) AS arrivals
    FROM req
    WHERE ? IS NULL OR traffic_class = ?
    GROUP BY 1
),
ranked AS (
    SELECT slice, arrivals, ntile(10) OVER (ORDER BY arrivals DESC, slice) AS decile
    FROM s
)
SELECT
    (decile = 1)                                                AS busy,
    count(*)                                                    AS slices,
    avg(arrivals)                                               AS arrivals_mean,
    list(slice)                                                 AS slice_ids
FROM ranked
GROUP BY busy
