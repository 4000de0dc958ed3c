-- Requests in the busiest slices (list ?) against the rest: queue share and latency.
SELECT
    list_contains(?, start_ns // ?)                             AS busy,
    count(*)                                                    AS n,
    sum(queue_ms) / nullif(sum(e2e_ms), 0)                      AS queue_share,
    median(e2e_ms)                                              AS e2e_p50,
    quantile_cont(e2e_ms, 0.95)                                 AS e2e_p95,
    sum(e2e_ms)                                                 AS e2e_total
FROM req
GROUP BY busy
