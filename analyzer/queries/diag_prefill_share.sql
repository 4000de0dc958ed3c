-- long_wait_then_fast's first check, over diag_prefill's requests (a first token, the server
-- seen): how much of the wait for the first token is prefill, and how many waited less
-- than ? ms for it.  Sums and counts only (the TTFT median is below the bar where more than
-- half the requests are): diag_prefill's medians read every request's TTFT (about 1.6 CPU-s
-- at 10 M requests, these sums 0.1), and a wait that is mostly queue or network, or short,
-- stops here.
SELECT
    count(*)                                                    AS n,
    sum(prefill_ms) / nullif(sum(coalesce(ttft_ms, ttft_client_ms)), 0) AS prefill_share_of_ttft,
    count(*) FILTER (WHERE coalesce(ttft_ms, ttft_client_ms) < ?) AS below_ttft
FROM req
WHERE coalesce(ttft_ms, ttft_client_ms) IS NOT NULL AND NOT list_contains(flags, 'server_unseen')
