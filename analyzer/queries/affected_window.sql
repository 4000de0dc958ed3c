-- Requests of the window whose queue is at least ? of E2E (GPU signals: time, not rows), most queued first.
SELECT trace_id, kept, count(*) OVER () AS matched FROM req
WHERE queue_ms >= ? * e2e_ms
ORDER BY e2e_ms DESC, trace_id LIMIT 5000
