-- Requests arriving in the busiest slices (list ?, slice length ?), most queued first.
WITH affected AS (
    SELECT * FROM req
    WHERE list_contains(?, start_ns // ?)
)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY queue_ms DESC, trace_id LIMIT 5000
