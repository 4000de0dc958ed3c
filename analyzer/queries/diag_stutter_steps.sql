-- Did large prefill steps (>= ? tokens) run during the decode of stalled streams, more
-- than during smooth ones?  Decode window on the server clock: [start + ttft, start + e2e].
-- A step counts only for the streams of its own engine (service and instance): another
-- replica's prefill at the same moment froze nobody here.
WITH r AS (
    SELECT trace_id, service, instance, stall_count > 0 AS stalled,
           start_ns + CAST(coalesce(ttft_ms, 0) * 1e6 AS BIGINT) AS d0,
           start_ns + CAST(e2e_ms * 1e6 AS BIGINT) AS d1
    FROM req
    WHERE itl_p50_ms IS NOT NULL AND output_tokens >= 3
    USING SAMPLE reservoir(4000 ROWS) REPEATABLE (7)
),
big AS (
    SELECT service, instance, start_ns FROM engine_steps
    WHERE prefill_tokens >= ? AND start_ns BETWEEN ? AND ?
),
hit AS (
    SELECT DISTINCT r.trace_id FROM r JOIN big
        ON big.service = r.service AND big.instance = r.instance
       AND big.start_ns BETWEEN r.d0 AND r.d1
)
SELECT r.stalled, count(*) AS n, count(hit.trace_id) AS overlapped
FROM r LEFT JOIN hit ON r.trace_id = hit.trace_id
GROUP BY r.stalled
