-- Requests arriving in slices (? ns) where their own engine's (`request_engine`: their
-- instance, or the engine process whose steps name them) KV usage reached ? (steps in
-- [?, ?]), most queued first; `cut`: the 5000th largest queue, as affected_peak_hours.sql has it.
WITH hot AS (
    SELECT DISTINCT service, instance, start_ns // ? AS slice FROM engine_steps
    WHERE kv_usage >= ? AND start_ns BETWEEN ? AND ?
),
asked AS (
    SELECT trace_id, request_id, service, instance, kept, queue_ms, e2e_ms,
           start_ns AS t0, start_ns + CAST(e2e_ms * 1e6 AS BIGINT) AS t1
    FROM req
),
{request_engines},
affected AS (
    SELECT DISTINCT trace_id, request_id, kept, queue_ms, e2e_ms FROM request_engine e SEMI JOIN hot
        ON e.service = hot.service AND e.engine = hot.instance AND e.t0 // ? = hot.slice
),
cut AS (
    SELECT count(*) AS matched, coalesce(max(queue_ms, 5000)[-1], '-inf') AS queue_ms
    FROM affected
)
SELECT trace_id, kept, cut.matched FROM affected JOIN cut ON affected.queue_ms >= cut.queue_ms
ORDER BY affected.queue_ms DESC, e2e_ms DESC, trace_id LIMIT 5000
