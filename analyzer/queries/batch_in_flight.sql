-- Shared CTEs: how many batch requests were in flight on a live request's instance (same
-- service and instance) when it arrived.  A query includes them as `{batch_in_flight}` in
-- its WITH list; `live_beside` is each live (non-batch) request with `in_flight`.
-- One sweep over arrivals and ends, not a join of every live request with every batch
-- request of its instance: a batch start counts at its own instant, an end after it.
batch_events AS (
    SELECT service, instance, start_ns AS t, 1 AS d, NULL AS trace_id, NULL AS request_id
    FROM req WHERE traffic_class = 'batch'
    UNION ALL
    SELECT service, instance, start_ns + CAST(e2e_ms * 1e6 AS BIGINT), -1, NULL, NULL
    FROM req WHERE traffic_class = 'batch'
    UNION ALL
    SELECT service, instance, start_ns, 0, trace_id, request_id
    FROM req WHERE traffic_class <> 'batch'
),
batch_running AS (
    SELECT trace_id, request_id, d,
           sum(d) OVER (PARTITION BY service, instance ORDER BY t, d DESC ROWS UNBOUNDED PRECEDING) AS in_flight
    FROM batch_events
),
live_beside AS (
    SELECT req.*, b.in_flight
    FROM req JOIN batch_running b ON b.d = 0 AND b.trace_id = req.trace_id AND b.request_id = req.request_id
    WHERE req.traffic_class <> 'batch'
)
