-- Shared CTEs: `cold`, the cold requests of `req` as `cold_requests` flags them (the SDK's
-- mark; a request during an engine start-up of its instance or within ? ns after it; an
-- instance's first request where the window shows at least ? instances), found from the few
-- requests that can be cold and not by flagging every request: a query that reads the cold
-- side alone includes them as `{cold_set}` (0.2 CPU-s at 10 M requests against 0.7 for
-- `cold_requests`' flags and the warm median), with `cold_requests`' parameters.  `cold` has
-- the columns the cold side reads, `wait` (TTFT, the client's, else the E2E) and
-- `after_start`.
start_reach AS (
    SELECT service, instance, start_ns, end_ns + ? AS reach_ns FROM engine_starts
),
first_ns AS MATERIALIZED (
    SELECT service, instance, min(start_ns) AS start_ns
    FROM req WHERE instance <> '' GROUP BY service, instance
),
-- the requests that may be cold, each once: the marked ones, those at an instance's first
-- instant, and those in an engine start-up's reach.  Each part reads the columns of its few
-- rows only: the filter or the join's keys (DuckDB hands a join's key range to the scan) pick
-- the rows first.
marked AS (
    SELECT service, instance, start_ns, trace_id, request_id, cold_start, e2e_ms, kept,
           coalesce(ttft_ms, ttft_client_ms, e2e_ms) AS wait
    FROM req WHERE cold_start
),
at_first AS (
    SELECT r.service, r.instance, r.start_ns, r.trace_id, r.request_id, r.cold_start, r.e2e_ms,
           r.kept,
           coalesce(r.ttft_ms, r.ttft_client_ms, r.e2e_ms) AS wait
    FROM req r SEMI JOIN first_ns f
      ON f.start_ns = r.start_ns AND f.service = r.service AND f.instance = r.instance
    WHERE NOT r.cold_start
),
in_start AS (
    SELECT r.service, r.instance, r.start_ns, r.trace_id, r.request_id, r.cold_start, r.e2e_ms,
           r.kept,
           coalesce(r.ttft_ms, r.ttft_client_ms, r.e2e_ms) AS wait
    FROM req r SEMI JOIN start_reach e
      ON e.service = r.service AND e.instance = r.instance
     AND r.start_ns BETWEEN e.start_ns AND e.reach_ns
    WHERE NOT r.cold_start
),
maybe_cold AS MATERIALIZED (
    SELECT * FROM marked
    UNION ALL
    SELECT * FROM at_first
    UNION ALL
    SELECT s.* FROM in_start s ANTI JOIN first_ns f
      ON f.start_ns = s.start_ns AND f.service = s.service AND f.instance = s.instance
),
-- as cold_requests' after_starts, of these requests only (a request's being in a start-up's
-- reach depends on its service, instance and start alone)
after_starts AS (
    SELECT DISTINCT m.service, m.instance, m.start_ns
    FROM maybe_cold m JOIN start_reach e
      ON e.service = m.service AND e.instance = m.instance
     AND m.start_ns BETWEEN e.start_ns AND e.reach_ns
),
-- as cold_requests' first_pick: of the requests tied at an instance's first instant, the
-- least (trace_id, request_id)
first_pick AS (
    SELECT m.service, m.instance, m.start_ns, min((m.trace_id, m.request_id)) AS ids
    FROM maybe_cold m SEMI JOIN first_ns f
      ON f.service = m.service AND f.instance = m.instance AND f.start_ns = m.start_ns
    GROUP BY m.service, m.instance, m.start_ns
),
cold AS MATERIALIZED (
    SELECT m.*, a.start_ns IS NOT NULL AS after_start
    FROM maybe_cold m
    LEFT JOIN after_starts a
      ON a.service = m.service AND a.instance = m.instance AND a.start_ns = m.start_ns
    LEFT JOIN first_pick p
      ON p.service = m.service AND p.instance = m.instance AND p.start_ns = m.start_ns
    WHERE m.cold_start OR a.start_ns IS NOT NULL
       OR (coalesce((m.trace_id, m.request_id) = p.ids, false)
           AND (SELECT count(*) FROM first_ns) >= ?)
)
