-- Requests of the window whose queue is at least ? of E2E (GPU signals: time, not rows), most queued first.
WITH affected AS (
    SELECT * FROM req
    WHERE queue_ms >= ? * e2e_ms
)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY e2e_ms DESC, trace_id LIMIT 5000
