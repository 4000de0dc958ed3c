-- Requests arriving while the GPU was saturated (utilization >= ?), most queued first.
WITH hot AS (
    SELECT DISTINCT ts_ns // ? AS slice FROM gpu_samples
    WHERE utilization_pct >= ? AND ts_ns BETWEEN ? AND ?
),
affected AS (
    SELECT * FROM req SEMI JOIN hot ON req.start_ns // ? = hot.slice
)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY queue_ms DESC, e2e_ms DESC, trace_id LIMIT 5000
