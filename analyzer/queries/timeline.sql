-- Latency percentiles per time slice (? ns) for charts: e2e and TTFT p50/p95, count.
SELECT
    start_ns // ? * ?                                           AS slice_start_ns,
    count(*)                                                    AS requests,
    quantile_cont(e2e_ms, [0.5, 0.95, 0.99])                    AS e2e,
    quantile_cont(coalesce(ttft_ms, ttft_client_ms), [0.5, 0.95]) AS ttft,
    sum(queue_ms) / nullif(sum(e2e_ms), 0)                      AS queue_share
FROM req
GROUP BY 1
ORDER BY 1
