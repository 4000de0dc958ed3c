-- The window's counts and sums; the latencies' p50/p90/p95/p99 are report.py's
-- `LATENCY_COLUMNS`, counted by analyzer/quantiles.py (exact, linear in the window), and
-- the counts and bounds DuckDB can take from statistics are latency_bounds.sql's.
-- The filtered request set arrives as the CTE `req` (see analyzer/filters.py).
-- Counts are count_if (coalesced: it is NULL over no rows), not `count(*) FILTER (WHERE
-- ...)`: DuckDB 1.5 runs a filtered aggregate apart (see diag_signals.sql).
SELECT
    coalesce(count_if(kept), 0)                         AS kept,
    coalesce(count_if(error), 0)                        AS errors,
    coalesce(count_if(list_contains(flags, 'server_unseen')), 0) AS server_unseen,
    count(DISTINCT service)                             AS services,
    sum(e2e_ms)                                         AS e2e_total,
    sum(coalesce(network_ms, 0))                        AS network_total,
    sum(queue_ms)                                       AS queue_total,
    sum(prefill_ms)                                     AS prefill_total,
    sum(decode_ms)                                      AS decode_total,
    sum(queue_wait_ms)                                  AS queue_wait_total,
    sum(tokenize_ms)                                    AS tokenize_total,
    sum(other_ms)                                       AS other_total
FROM req
