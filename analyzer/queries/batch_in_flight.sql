-- Shared CTEs: how many batch requests were in flight on a live request's instance (same
-- service and instance) when it arrived.  A query includes them as `{batch_in_flight}` in
-- its WITH list; `live_beside` is each live (non-batch) request with `in_flight` and `ttft`.
-- One sweep over arrivals and ends, not a join of every live request with every batch
-- request of its instance: a batch start counts at its own instant, an end after it.  The
-- live requests ride through the sweep whole (UNION ALL BY NAME pads the batch events'
-- other columns with NULL) rather than being joined back to `req` on their ids after it:
-- that string join cost more than the sweep, and DuckDB reads only the columns a query uses.
-- `d` is a TINYINT, not an INTEGER literal: DuckDB 1.5 sums a running window of TINYINT
-- several times faster (diag_batch_concurrency 11.5 -> 7 CPU-s at 10 M requests, same counts).
-- What the sweep carries is what its readers aggregate, so `ttft` (the server's, else the
-- client's) is one column through the window, not two; `in_flight` is an INTEGER, not the
-- HUGEINT a sum gives, for the median after it (together about -15 % CPU at 10 M).
-- Tried, no gain at 10 M: ORDER BY service, instance, t without PARTITION BY (each instance's
-- +1s and -1s sum to 0, so the running sum is the same); this sweep and heavy_in_flight as one
-- window with two sums (fewer rows, but every row wider: 11-12 CPU-s against 11.8 for the two).
batch_events AS (
    SELECT service, instance, start_ns AS t, CAST(1 AS TINYINT) AS d
    FROM req WHERE traffic_class = 'batch'
    UNION ALL BY NAME
    SELECT service, instance, start_ns + CAST(e2e_ms * 1e6 AS BIGINT) AS t, CAST(-1 AS TINYINT) AS d
    FROM req WHERE traffic_class = 'batch'
    UNION ALL BY NAME
    SELECT *, coalesce(ttft_ms, ttft_client_ms) AS ttft, start_ns AS t, CAST(0 AS TINYINT) AS d
    FROM req WHERE traffic_class <> 'batch'
),
batch_running AS (
    SELECT *,
           CAST(sum(d) OVER (PARTITION BY service, instance ORDER BY t, d DESC ROWS UNBOUNDED PRECEDING)
                AS INTEGER) AS in_flight
    FROM batch_events
),
live_beside AS (
    SELECT * EXCLUDE (t, d) FROM batch_running WHERE d = 0
)
