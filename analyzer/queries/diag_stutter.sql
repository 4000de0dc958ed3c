-- Streams that froze: a gap far above the stream's own median (stall_count > 0).
SELECT
    count(*)                                                    AS n,
    count(*) FILTER (WHERE stall_count > 0)                     AS stalled,
    median(itl_p50_ms)                                          AS itl_p50,
    quantile_cont(itl_max_ms, 0.95)                             AS itl_max_p95,
    median(itl_max_ms) FILTER (WHERE stall_count > 0)           AS stalled_max_p50,
    sum(decode_ms) FILTER (WHERE stall_count > 0) / nullif(sum(e2e_ms), 0) AS stalled_decode_share
FROM req
WHERE itl_p50_ms IS NOT NULL AND output_tokens >= 3
