-- How many interactive requests arrived in slices (? ns) where batch traffic was running and
-- in slices where it was not (as diag_batch_mode splits them), without their medians: one
-- pass of per-slice counts, so the medians are computed only where they are compared.
-- Read where diag_slice_mix has too many rows (slice_mix.batch_sides adds it up from that
-- pass otherwise, held to this query by tests/analyzer/test_slice_mix.py).
WITH slices AS (
    SELECT count(*) FILTER (WHERE traffic_class = 'batch')    AS batch,
           count(*) FILTER (WHERE traffic_class <> 'batch')   AS live
    FROM req GROUP BY start_ns // ?
)
SELECT (batch > 0) AS with_batch, sum(live) AS n
FROM slices
GROUP BY with_batch
