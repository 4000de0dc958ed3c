-- Per tenant: volume (tokens, else requests), tail latency and queue.  Class ? or all.
SELECT
    tenant,
    count(*)                                                    AS n,
    coalesce(sum(coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0)), 0) AS tokens,
    quantile_cont(e2e_ms, 0.95)                                 AS e2e_p95,
    quantile_cont(queue_ms, 0.95)                               AS queue_p95,
    median(queue_ms)                                            AS queue_p50,
    sum(queue_ms) / nullif(sum(e2e_ms), 0)                      AS queue_share,
    sum(e2e_ms)                                                 AS e2e_total
FROM req
WHERE tenant <> '' AND (? IS NULL OR traffic_class = ?)
GROUP BY tenant
ORDER BY tokens DESC, n DESC, tenant
