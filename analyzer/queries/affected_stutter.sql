-- Streams that froze, longest gap first.
SELECT trace_id, kept FROM req
WHERE stall_count > 0
ORDER BY itl_max_ms DESC LIMIT 5000
