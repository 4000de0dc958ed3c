-- Whether the scheduler queue dominates the whole window, not only its busiest slices.
-- Counted on the traffic class given (? twice, NULL: all), per slice of ? ns, with ? (thrice)
-- the share of a slice's E2E that queue wait must reach for the slice to count as
-- queue-dominated; `tail_slices` counts the queue-dominated slices after the last quiet one.
-- Little's law gives the mean queue length and the mean number served: summed time
-- over the window's length.  The first and last fifth of arrivals say whether the
-- backlog grows (arrivals outpace service) or holds (service at capacity).
WITH r AS (
    SELECT start_ns, e2e_ms, queue_wait_ms, prefill_ms + decode_ms AS compute_ms
    FROM req
    WHERE ? IS NULL OR traffic_class = ?
),
s AS (
    SELECT start_ns // ? AS slice, sum(queue_wait_ms) / nullif(sum(e2e_ms), 0) AS share, sum(e2e_ms) AS e2e
    FROM r
    GROUP BY 1
),
f AS (
    SELECT min(slice) AS first_slice, max(slice) FILTER (WHERE coalesce(share, 0) < ?) AS last_quiet FROM s
),
sl AS (
    SELECT
        count(*)                                                AS slices,
        count(*) FILTER (WHERE share >= ?)                      AS dominated,
        sum(e2e) FILTER (WHERE share >= ?)                      AS dominated_e2e,
        median(share)                                           AS slice_share_p50,
        count(*) FILTER (WHERE s.slice > coalesce(f.last_quiet, f.first_slice - 1)) AS tail_slices,
        any_value(coalesce(f.last_quiet, f.first_slice - 1) + 1 - f.first_slice) AS tail_from_slices
    FROM s, f
),
q AS (
    SELECT queue_wait_ms, ntile(5) OVER (ORDER BY start_ns) AS fifth FROM r
)
SELECT
    count(*)                                                    AS n,
    sum(r.queue_wait_ms) / nullif(sum(r.e2e_ms), 0)             AS queue_share,
    median(r.queue_wait_ms / nullif(r.e2e_ms, 0))               AS request_share_p50,
    median(r.queue_wait_ms)                                     AS queue_wait_p50,
    quantile_cont(r.queue_wait_ms, 0.95)                        AS queue_wait_p95,
    median(r.compute_ms)                                        AS compute_p50,
    quantile_cont(r.e2e_ms, 0.95)                               AS e2e_p95,
    sum(r.e2e_ms)                                               AS e2e_total,
    sum(r.queue_wait_ms)                                        AS queue_wait_total,
    sum(r.compute_ms)                                           AS compute_total,
    (max(r.start_ns + CAST(r.e2e_ms * 1e6 AS BIGINT)) - min(r.start_ns)) / 1e6 AS span_ms,
    any_value(sl.slices)                                        AS slices,
    any_value(sl.dominated)                                     AS dominated,
    any_value(sl.dominated_e2e)                                 AS dominated_e2e,
    any_value(sl.slice_share_p50)                               AS slice_share_p50,
    any_value(sl.tail_slices)                                   AS tail_slices,
    any_value(sl.tail_from_slices)                              AS tail_from_slices,
    (SELECT median(queue_wait_ms) FROM q WHERE fifth = 1)       AS first_wait_p50,
    (SELECT median(queue_wait_ms) FROM q WHERE fifth = 5)       AS last_wait_p50
FROM r, sl
