-- Requests arriving in the most loaded quarter of slices (? ns; as diag_concurrency counts
-- offered load) whose queue is at least ? of E2E, most queued first.
WITH s AS (
    SELECT start_ns // ? AS slice, sum(prefill_ms + decode_ms) * 1e6 / ? AS in_flight
    FROM req GROUP BY 1
),
ranked AS (SELECT slice, ntile(4) OVER (ORDER BY in_flight, slice) AS q FROM s),
affected AS (
    SELECT req.*
    FROM req JOIN ranked ON req.start_ns // ? = ranked.slice
    WHERE ranked.q = 4 AND req.queue_ms >= ? * req.e2e_ms
)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY queue_ms DESC, trace_id LIMIT 5000
