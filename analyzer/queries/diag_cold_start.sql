-- Cold requests against warm ones.  Cold: the SDK's mark; a request that started during an
-- engine start-up of its instance or within ? ns after it (`engine_starts`: vLLM's start-up
-- trace); or the first request seen from an instance, the latter only where the window
-- shows at least ? instances (with one instance its first request in the window is just the
-- window's edge, not a start).  The instance counts read `req` only, so filters (service,
-- window) bound them too.
WITH firsts AS (
    SELECT *, instance <> '' AND row_number() OVER (PARTITION BY service, instance ORDER BY start_ns) = 1 AS first_seen,
           EXISTS (
               SELECT 1 FROM engine_starts e
               WHERE e.service = req.service AND e.instance = req.instance
                 AND req.start_ns BETWEEN e.start_ns AND e.end_ns + ?
           ) AS after_start
    FROM req
),
r AS (
    SELECT *, coalesce(ttft_ms, ttft_client_ms, e2e_ms) AS wait,
           cold_start OR after_start
               OR (first_seen AND (SELECT count(*) FROM firsts WHERE first_seen) >= ?) AS cold
    FROM firsts
)
SELECT cold, count(*) AS n, median(wait) AS wait_p50, count(DISTINCT (service, instance)) AS instances,
       count(*) FILTER (WHERE cold_start) AS marked, count(*) FILTER (WHERE after_start) AS after_start,
       sum(e2e_ms) AS e2e_total
FROM r GROUP BY cold
