-- Small prompts (<= ? tokens) that spent at least half their wait for the first token on
-- network + queue (the wait of first_token_waits, as diag_tiny_prompts reads it); worst first.
WITH {first_token_waits},
affected AS (
    SELECT trace_id, kept, wait_ms, first_compute_ms FROM first_token_waits
    WHERE prompt_tokens <= ? AND wait_ms > 0 AND wait_ms - first_compute_ms >= 0.5 * wait_ms
)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY wait_ms - first_compute_ms DESC, trace_id LIMIT 5000
