-- Shared CTEs: each request of `req` with `cold`.  Cold: the SDK's mark; a request that
-- started during an engine start-up of its instance or within ? ns after it
-- (`engine_starts`: vLLM's start-up trace); or the first request seen from an instance, the
-- latter only where the window shows at least ? instances (with one instance its first
-- request in the window is just the window's edge, not a start).  The instance counts read
-- `req` only, so filters (service, window) bound them too.  A query includes them as
-- `{cold_requests}` in its WITH list; `cold_req` is each request with `cold`.
firsts AS (
    SELECT *, instance <> '' AND row_number() OVER (PARTITION BY service, instance ORDER BY start_ns) = 1 AS first_seen,
           EXISTS (
               SELECT 1 FROM engine_starts e
               WHERE e.service = req.service AND e.instance = req.instance
                 AND req.start_ns BETWEEN e.start_ns AND e.end_ns + ?
           ) AS after_start
    FROM req
),
cold_req AS (
    SELECT *, cold_start OR after_start
               OR (first_seen AND (SELECT count(*) FROM firsts WHERE first_seen) >= ?) AS cold
    FROM firsts
)
