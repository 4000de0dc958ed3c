-- Streams that froze, longest gap first.
WITH affected AS (
    SELECT * FROM req
    WHERE stall_count > 0
)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY itl_max_ms DESC, trace_id LIMIT 5000
