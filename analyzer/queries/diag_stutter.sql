-- How the window's streams froze, where diag_stutter_streams found enough of them frozen
-- (stall_count > 0): the typical gap, and the frozen streams' longest gaps.
SELECT
    median(itl_p50_ms)                                          AS itl_p50,
    quantile_cont(itl_max_ms, 0.95)                             AS itl_max_p95,
    median(itl_max_ms) FILTER (WHERE stall_count > 0)           AS stalled_max_p50,
    sum(decode_ms) FILTER (WHERE stall_count > 0) / nullif(sum(e2e_ms), 0) AS stalled_decode_share
FROM req
WHERE itl_p50_ms IS NOT NULL AND output_tokens >= 3
