-- Small prompts (<= ? tokens) that spent at least half their wait for the first token on
-- network + queue (the wait as diag_tiny_prompts defines it); worst first.
WITH w AS (
    SELECT trace_id, kept,
           coalesce(ttft_client_ms, coalesce(network_ms, 0) + ttft_ms, e2e_ms) AS wait_ms,
           CASE WHEN ttft_client_ms IS NULL AND ttft_ms IS NULL THEN prefill_ms + decode_ms
                ELSE prefill_ms END AS first_compute_ms
    FROM req
    WHERE prompt_tokens <= ? AND e2e_ms > 0
),
affected AS (
    SELECT * FROM w
    WHERE wait_ms > 0 AND wait_ms - first_compute_ms >= 0.5 * wait_ms
)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY wait_ms - first_compute_ms DESC, trace_id LIMIT 5000
