-- Latency and queue share per deployment environment.
SELECT
    environment,
    count(*)                                                    AS n,
    sum(queue_ms) / nullif(sum(e2e_ms), 0)                      AS queue_share,
    median(e2e_ms)                                              AS e2e_p50,
    quantile_cont(e2e_ms, 0.95)                                 AS e2e_p95,
    median(prefill_ms + decode_ms)                              AS compute_p50,
    sum(e2e_ms)                                                 AS e2e_total
FROM req
WHERE environment <> ''
GROUP BY environment
ORDER BY n DESC, environment
