-- Streams that froze, longest gap first.
SELECT trace_id, kept, count(*) OVER () AS matched FROM req
WHERE stall_count > 0
ORDER BY itl_max_ms DESC, trace_id LIMIT 5000
