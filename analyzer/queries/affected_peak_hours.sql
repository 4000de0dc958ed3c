-- Requests arriving in the busiest slices (list ?, slice length ?), most queued first.
SELECT trace_id, kept, count(*) OVER () AS matched FROM req
WHERE list_contains(?, start_ns // ?)
ORDER BY queue_ms DESC, trace_id LIMIT 5000
