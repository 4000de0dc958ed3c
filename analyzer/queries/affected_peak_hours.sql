-- Requests arriving in the busiest slices (list ?, slice length ?), most queued first.
SELECT trace_id, kept FROM req
WHERE list_contains(?, start_ns // ?)
ORDER BY queue_ms DESC LIMIT 5000
