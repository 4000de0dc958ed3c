-- Window-wide numbers every diagnosis signal compares against.  (last_end_ns's cast of every
-- E2E to ns is half of its 0.18 CPU-s at 10 M requests; folded into diag_signals' pass, the
-- two cost more than apart: see there.)
SELECT
    count(*)                                                    AS n,
    min(start_ns)                                               AS first_ns,
    max(start_ns + CAST(e2e_ms * 1e6 AS BIGINT))                AS last_end_ns,
    max(start_ns) - min(start_ns)                               AS span_ns,
    sum(e2e_ms)                                                 AS e2e_total,
    sum(queue_ms) / nullif(sum(e2e_ms), 0)                      AS queue_share,
    sum(coalesce(network_ms, 0)) / nullif(sum(e2e_ms), 0)       AS network_share,
    count(DISTINCT traffic_class)                               AS classes
FROM req
