-- Did large prefill steps (>= ? tokens) run during the decode of stalled streams, more
-- than during smooth ones?  Decode window on the server clock: [start + ttft, start + e2e].
-- A step counts only for the streams of its own engine (`request_engine`: the stream's
-- instance, or the engine process whose steps name it): another replica's prefill at the
-- same moment froze nobody here.
WITH asked AS MATERIALIZED (
    SELECT trace_id, request_id, service, instance, stall_count > 0 AS stalled,
           start_ns AS t0, start_ns + CAST(e2e_ms * 1e6 AS BIGINT) AS t1,
           start_ns + CAST(coalesce(ttft_ms, 0) * 1e6 AS BIGINT) AS d0,
           start_ns + CAST(e2e_ms * 1e6 AS BIGINT) AS d1
    FROM req
    WHERE itl_p50_ms IS NOT NULL AND output_tokens >= 3
    USING SAMPLE reservoir(4000 ROWS) REPEATABLE (7)
),
{request_engines},
big AS (
    SELECT service, instance, start_ns FROM engine_steps
    WHERE prefill_tokens >= ? AND start_ns BETWEEN ? AND ?
),
hit AS (
    SELECT DISTINCT e.trace_id FROM request_engine e JOIN big
        ON big.service = e.service AND big.instance = e.engine
       AND big.start_ns BETWEEN e.d0 AND e.d1
)
SELECT r.stalled, count(*) AS n, count(hit.trace_id) AS overlapped
FROM asked r LEFT JOIN hit ON r.trace_id = hit.trace_id
GROUP BY r.stalled
