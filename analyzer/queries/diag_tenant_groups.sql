-- The heavy tenants (list ?) against the rest, pooled: tail latency and queue.  Class ? or all.
-- (No queue median: unread, it cost a sort of every request's queue time.)
-- Read only where diag_tenant_queue_buckets' counts cannot rule the queue contrast out
-- (tenant_queues.py): at 10 M requests, tenants queueing alike, they do (0.26 CPU-s, not 0.6).
SELECT
    list_contains(?, tenant)                                    AS heavy,
    count(*)                                                    AS n,
    quantile_cont(e2e_ms, 0.95)                                 AS e2e_p95,
    quantile_cont(queue_ms, 0.95)                               AS queue_p95,
    sum(queue_ms) / nullif(sum(e2e_ms), 0)                      AS queue_share,
    sum(e2e_ms)                                                 AS e2e_total
FROM req
WHERE tenant <> '' AND (? IS NULL OR traffic_class = ?)
GROUP BY heavy
