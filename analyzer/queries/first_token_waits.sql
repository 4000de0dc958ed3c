-- Shared CTE: each request of `req` with a prompt size and an E2E, with `wait_ms`, the
-- user's wait for the first token (TTFT as the client saw it, else network + the server's
-- TTFT, else, with no first-token time, the whole E2E), and `first_compute_ms`, the compute
-- inside it (prefill; with no first-token time, prefill + decode).  tiny_prompts_slow's
-- queries include it as `{first_token_waits}`, so its check, its figures and its affected
-- requests judge one wait.
first_token_waits AS NOT MATERIALIZED (
    SELECT req.*,
           coalesce(ttft_client_ms, coalesce(network_ms, 0) + ttft_ms, e2e_ms) AS wait_ms,
           CASE WHEN ttft_client_ms IS NULL AND ttft_ms IS NULL THEN prefill_ms + decode_ms
                ELSE prefill_ms END AS first_compute_ms
    FROM req
    WHERE prompt_tokens IS NOT NULL AND e2e_ms > 0
)
