-- Requests of environment ? whose queue dominates, most queued first.
WITH affected AS (
    SELECT * FROM req
    WHERE environment = ? AND queue_ms >= 0.3 * e2e_ms
)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY queue_ms DESC, trace_id LIMIT 5000
