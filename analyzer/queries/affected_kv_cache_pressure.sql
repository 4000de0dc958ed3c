-- Requests arriving in slices (? ns) where their own engine's (service and instance) KV
-- usage reached ? (steps in [?, ?]), most queued first.
WITH hot AS (
    SELECT DISTINCT service, instance, start_ns // ? AS slice FROM engine_steps
    WHERE kv_usage >= ? AND start_ns BETWEEN ? AND ?
)
SELECT trace_id, kept FROM req SEMI JOIN hot
    ON req.service = hot.service AND req.instance = hot.instance AND req.start_ns // ? = hot.slice
ORDER BY queue_ms DESC, e2e_ms DESC LIMIT 5000
