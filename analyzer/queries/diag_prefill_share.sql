-- How much of the wait for the first token is prefill (diag_prefill's requests: a first
-- token, the server seen): long_wait_then_fast's first check.  Sums only: diag_prefill's
-- medians read every request's TTFT (about 1.6 CPU-s at 10 M requests, these sums 0.1),
-- and a wait that is mostly queue or network stops here.
SELECT
    count(*)                                                    AS n,
    sum(prefill_ms) / nullif(sum(coalesce(ttft_ms, ttft_client_ms)), 0) AS prefill_share_of_ttft
FROM req
WHERE coalesce(ttft_ms, ttft_client_ms) IS NOT NULL AND NOT list_contains(flags, 'server_unseen')
