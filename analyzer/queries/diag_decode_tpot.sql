-- How fast the window's streams decode: TPOT p50 and its low tail (a stream's time per
-- token after the first), and the share of all E2E time spent decoding.
SELECT
    count(tpot_ms)                                              AS streams,
    median(tpot_ms)                                             AS tpot_p50,
    quantile_cont(tpot_ms, 0.1)                                 AS tpot_p10,
    sum(decode_ms) / nullif(sum(e2e_ms), 0)                     AS decode_share
FROM req
WHERE output_tokens >= 3
