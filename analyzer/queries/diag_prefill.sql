-- TTFT against prompt size: how much of the wait is pre-fill, and how decode streams after it.
-- Requests whose server was not seen (client spans only) are left out: their whole wait
-- reads as pre-fill because it cannot be split, so they would claim a pre-fill nobody measured.
WITH r AS (
    SELECT *, coalesce(ttft_ms, ttft_client_ms) AS ttft
    FROM req
    WHERE coalesce(ttft_ms, ttft_client_ms) IS NOT NULL AND NOT list_contains(flags, 'server_unseen')
),
q AS (SELECT quantile_disc(prompt_tokens, 0.25) AS lo, quantile_disc(prompt_tokens, 0.75) AS hi FROM r)
SELECT
    count(*)                                                    AS n,
    median(ttft)                                                AS ttft_p50,
    quantile_cont(ttft, 0.9)                                    AS ttft_p90,
    median(tpot_ms)                                             AS tpot_p50,
    sum(prefill_ms) / nullif(sum(ttft), 0)                      AS prefill_share_of_ttft,
    sum(prefill_ms) / nullif(sum(e2e_ms), 0)                    AS prefill_share,
    -- NULL, not NaN, where it is undefined (every prompt the same size): NaN would reach
    -- the evidence's numbers, and JSON has no NaN
    CASE WHEN isfinite(corr(prompt_tokens, ttft)) THEN corr(prompt_tokens, ttft) END AS prompt_ttft_corr,
    median(ttft) FILTER (WHERE prompt_tokens >= q.hi)           AS ttft_long_p50,
    median(ttft) FILTER (WHERE prompt_tokens <= q.lo)           AS ttft_short_p50,
    any_value(q.lo)                                             AS short_tokens,
    any_value(q.hi)                                             AS long_tokens,
    sum(e2e_ms)                                                 AS e2e_total
FROM r, q
