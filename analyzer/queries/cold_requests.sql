-- Shared CTEs: each request of `req` with `cold`.  Cold: the SDK's mark; a request that
-- started during an engine start-up of its instance or within ? ns after it
-- (`engine_starts`: vLLM's start-up trace); or the first request seen from an instance, the
-- latter only where the window shows at least ? instances (with one instance its first
-- request in the window is just the window's edge, not a start).  The instance counts read
-- `req` only, so filters (service, window) bound them too.  A query includes them as
-- `{cold_requests}` in its WITH list; `cold_req` is each request with `cold`.
-- The engine start-ups each request falls in are one join (engine_starts is small), not a
-- subquery per request; the instance count is counted from `req`, so `firsts` is read once.
after_starts AS (
    SELECT DISTINCT r.service, r.instance, r.start_ns
    FROM req r JOIN engine_starts e
      ON e.service = r.service AND e.instance = r.instance
     AND r.start_ns BETWEEN e.start_ns AND e.end_ns + ?
),
-- Each instance's first request is picked by one aggregate (one row per instance), not a
-- row_number window, which sorted every request with its columns (4 CPU-s at 10 M); of
-- requests tied at the first instant, one is picked, as row_number picked one.
first_seen AS (
    SELECT service, instance, arg_min({'start_ns': start_ns, 'trace_id': trace_id, 'request_id': request_id}, start_ns)
               AS first
    FROM req WHERE instance <> '' GROUP BY service, instance
),
firsts AS (
    SELECT req.*,
           f.first IS NOT NULL AS first_seen,
           a.start_ns IS NOT NULL AS after_start
    FROM req
    LEFT JOIN first_seen f
      ON f.service = req.service AND f.instance = req.instance
     AND f.first.start_ns = req.start_ns AND f.first.trace_id = req.trace_id
     AND f.first.request_id = req.request_id
    LEFT JOIN after_starts a
      ON a.service = req.service AND a.instance = req.instance AND a.start_ns = req.start_ns
),
cold_req AS (
    SELECT *, cold_start OR after_start
               OR (first_seen AND (SELECT count(DISTINCT (service, instance)) FROM req WHERE instance <> '') >= ?) AS cold
    FROM firsts
)
