-- TTFT against prompt size: how much of the wait is pre-fill, and how decode streams after it.
-- Requests whose server was not seen (client spans only) are left out: their whole wait
-- reads as pre-fill because it cannot be split, so they would claim a pre-fill nobody measured.
-- Percentiles of one column are asked of one aggregate ([0.5, 0.9]; both quartiles): each
-- quantile aggregate gathers every value of the column, so two of them gather it twice.
WITH r AS (
    SELECT *, coalesce(ttft_ms, ttft_client_ms) AS ttft
    FROM req
    WHERE coalesce(ttft_ms, ttft_client_ms) IS NOT NULL AND NOT list_contains(flags, 'server_unseen')
),
q AS (
    SELECT quartiles[1] AS lo, quartiles[2] AS hi
    FROM (SELECT quantile_disc(prompt_tokens, [0.25, 0.75]) AS quartiles FROM r)
),
a AS (
    SELECT
        count(*)                                                AS n,
        quantile_cont(ttft, [0.5, 0.9])                         AS ttft_p,
        median(tpot_ms)                                         AS tpot_p50,
        sum(prefill_ms) / nullif(sum(ttft), 0)                  AS prefill_share_of_ttft,
        sum(prefill_ms) / nullif(sum(e2e_ms), 0)                AS prefill_share,
        -- NULL, not NaN, where it is undefined (every prompt the same size): NaN would reach
        -- the evidence's numbers, and JSON has no NaN
        CASE WHEN isfinite(corr(prompt_tokens, ttft)) THEN corr(prompt_tokens, ttft) END AS prompt_ttft_corr,
        median(ttft) FILTER (WHERE prompt_tokens >= q.hi)       AS ttft_long_p50,
        median(ttft) FILTER (WHERE prompt_tokens <= q.lo)       AS ttft_short_p50,
        any_value(q.lo)                                         AS short_tokens,
        any_value(q.hi)                                         AS long_tokens,
        sum(e2e_ms)                                             AS e2e_total
    FROM r, q
)
SELECT n, ttft_p[1] AS ttft_p50, ttft_p[2] AS ttft_p90, tpot_p50, prefill_share_of_ttft,
       prefill_share, prompt_ttft_corr, ttft_long_p50, ttft_short_p50, short_tokens,
       long_tokens, e2e_total
FROM a
