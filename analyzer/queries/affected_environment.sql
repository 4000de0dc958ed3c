-- Requests of environment ? whose queue dominates, most queued first.
-- `cut`: the 5000th largest queue, as affected_peak_hours.sql has it.
WITH affected AS (
    SELECT * FROM req
    WHERE environment = ? AND queue_ms >= 0.3 * e2e_ms
),
cut AS (
    SELECT count(*) AS matched, coalesce(max(queue_ms, 5000)[-1], '-inf') AS queue_ms
    FROM affected
)
SELECT trace_id, kept, cut.matched FROM affected JOIN cut ON affected.queue_ms >= cut.queue_ms
ORDER BY affected.queue_ms DESC, trace_id LIMIT 5000
