-- Requests of environment ? whose queue dominates, most queued first.
SELECT trace_id, kept, count(*) OVER () AS matched FROM req
WHERE environment = ? AND queue_ms >= 0.3 * e2e_ms
ORDER BY queue_ms DESC, trace_id LIMIT 5000
