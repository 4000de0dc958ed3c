-- Requests of environment ? whose queue dominates, most queued first.
SELECT trace_id, kept FROM req
WHERE environment = ? AND queue_ms >= 0.3 * e2e_ms
ORDER BY queue_ms DESC LIMIT 5000
