-- Requests of the window whose queue is at least ? of E2E (GPU signals: time, not rows), most queued first.
-- `cut`: the 5000th largest E2E, as affected_peak_hours.sql has it (e2e_ms is NOT NULL).
WITH affected AS (
    SELECT * FROM req
    WHERE queue_ms >= ? * e2e_ms
),
cut AS (
    SELECT count(*) AS matched, coalesce(max(e2e_ms, 5000)[-1], '-inf') AS e2e_ms FROM affected
)
SELECT trace_id, kept, cut.matched FROM affected JOIN cut ON affected.e2e_ms >= cut.e2e_ms
ORDER BY affected.e2e_ms DESC, trace_id LIMIT 5000
