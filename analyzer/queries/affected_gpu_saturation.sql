-- Requests arriving while the GPU was saturated (utilization >= ?), most queued first.
-- `cut`: the 5000th largest queue, as affected_peak_hours.sql has it.
WITH hot AS (
    SELECT DISTINCT ts_ns // ? AS slice FROM gpu_samples
    WHERE utilization_pct >= ? AND ts_ns BETWEEN ? AND ?
),
affected AS (
    SELECT * FROM req SEMI JOIN hot ON req.start_ns // ? = hot.slice
),
cut AS (
    SELECT count(*) AS matched, coalesce(max(queue_ms, 5000)[-1], '-inf') AS queue_ms
    FROM affected
)
SELECT trace_id, kept, cut.matched FROM affected JOIN cut ON affected.queue_ms >= cut.queue_ms
ORDER BY affected.queue_ms DESC, e2e_ms DESC, trace_id LIMIT 5000
