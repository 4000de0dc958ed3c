-- Shared CTEs: each request of `req` with `cold`.  Cold: the SDK's mark; a request that
-- started during an engine start-up of its instance or within ? ns after it
-- (`engine_starts`: vLLM's start-up trace); or the first request seen from an instance, the
-- latter only where the window shows at least ? instances (with one instance its first
-- request in the window is just the window's edge, not a start).  The instance counts read
-- `req` only, so filters (service, window) bound them too.  A query includes them as
-- `{cold_requests}` in its WITH list; `cold_req` is each request with `cold`.  The report's
-- queries read `cold_set` instead (the cold requests found from the few that can be cold, no
-- flag on every request); this plain definition is what the tests hold `cold_set` to.
-- The engine start-ups each request falls in are one join (engine_starts is small), not a
-- subquery per request; the instance count is counted from `first_ns`, so `firsts` is read once.
after_starts AS (
    SELECT DISTINCT r.service, r.instance, r.start_ns
    FROM req r JOIN engine_starts e
      ON e.service = r.service AND e.instance = r.instance
     AND r.start_ns BETWEEN e.start_ns AND e.end_ns + ?
),
-- Each instance's first instant is one aggregate over narrow columns (not a row_number
-- window, which sorted every request with its columns: 4 CPU-s at 10 M).  The ids that pick
-- one of the requests tied at that instant are read only for those few: the requests at no
-- first instant ride past on an anti join, since an arg_min or join on ids read and compared
-- both string columns of every request (diag_cold_start 1.9 -> 1.0 CPU-s at 10 M).  Of tied
-- requests the least (trace_id, request_id) is the first, so the pick is the same each run.
first_ns AS MATERIALIZED (
    SELECT service, instance, min(start_ns) AS start_ns
    FROM req WHERE instance <> '' GROUP BY service, instance
),
first_pick AS (
    SELECT r.service, r.instance, r.start_ns, min((r.trace_id, r.request_id)) AS ids
    FROM req r SEMI JOIN first_ns f
      ON f.service = r.service AND f.instance = r.instance AND f.start_ns = r.start_ns
    GROUP BY r.service, r.instance, r.start_ns
),
first_marked AS (
    SELECT req.*, false AS first_seen
    FROM req ANTI JOIN first_ns f
      ON f.service = req.service AND f.instance = req.instance AND f.start_ns = req.start_ns
    UNION ALL BY NAME
    SELECT req.*, (req.trace_id, req.request_id) = p.ids AS first_seen
    FROM req JOIN first_pick p
      ON p.service = req.service AND p.instance = req.instance AND p.start_ns = req.start_ns
),
firsts AS (
    SELECT m.*, a.start_ns IS NOT NULL AS after_start
    FROM first_marked m
    LEFT JOIN after_starts a
      ON a.service = m.service AND a.instance = m.instance AND a.start_ns = m.start_ns
),
-- the instances in view are first_ns's rows (each instance of `req` but the unnamed one)
cold_req AS (
    SELECT *, cold_start OR after_start
               OR (first_seen AND (SELECT count(*) FROM first_ns) >= ?) AS cold
    FROM firsts
)
