-- cold_start's first check, before diag_cold_start (which flags every request cold or warm and
-- takes the median wait of every warm one: 0.7 CPU-s at 10 M requests in a file, 2.7 over a
-- lake).  The cold side is small and found exactly, as `cold_requests` finds it, from the few
-- requests that can be cold: the SDK's marked ones, those at or before the last instance's
-- first instant (a range test, no join of every request), and those during an engine start-up
-- or within ? ns after it.  Of the warm side it gives counts only: how many, how many waits,
-- and how many of those are above a bar drawn from the cold median (its p50 over ?, and less
-- ? ms): the reader rules the finding out where more than half of the warm waits are above
-- the bar (the warm median is then too), and it runs diag_cold_start where it cannot.  A NaN
-- wait is not counted above (DuckDB sorts it last: a NaN median would read as a finding): it
-- is the one value above infinity (`NOT isnan(wait)` cost 0.02 CPU-s more at 10 M requests).
WITH first_ns AS MATERIALIZED (
    SELECT service, instance, min(start_ns) AS start_ns
    FROM req WHERE instance <> '' GROUP BY service, instance
),
-- the requests that may be cold, each once: the marked ones, those at an instance's first
-- instant, and those in an engine start-up's reach.  Each part reads the columns of its few
-- rows only: the filter or the join's keys (DuckDB hands a join's key range to the scan) pick
-- the rows first.
marked AS (
    SELECT service, instance, start_ns, trace_id, request_id, cold_start, e2e_ms,
           coalesce(ttft_ms, ttft_client_ms, e2e_ms) AS wait
    FROM req WHERE cold_start
),
at_first AS (
    SELECT r.service, r.instance, r.start_ns, r.trace_id, r.request_id, r.cold_start, r.e2e_ms,
           coalesce(r.ttft_ms, r.ttft_client_ms, r.e2e_ms) AS wait
    FROM req r SEMI JOIN first_ns f
      ON f.start_ns = r.start_ns AND f.service = r.service AND f.instance = r.instance
    WHERE NOT r.cold_start
),
in_start AS (
    SELECT r.service, r.instance, r.start_ns, r.trace_id, r.request_id, r.cold_start, r.e2e_ms,
           coalesce(r.ttft_ms, r.ttft_client_ms, r.e2e_ms) AS wait
    FROM req r SEMI JOIN engine_starts e
      ON e.service = r.service AND e.instance = r.instance
     AND r.start_ns BETWEEN e.start_ns AND e.end_ns + ?
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
    FROM maybe_cold m JOIN engine_starts e
      ON e.service = m.service AND e.instance = m.instance
     AND m.start_ns BETWEEN e.start_ns AND e.end_ns + ?
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
    SELECT m.*
    FROM maybe_cold m
    LEFT JOIN after_starts a
      ON a.service = m.service AND a.instance = m.instance AND a.start_ns = m.start_ns
    LEFT JOIN first_pick p
      ON p.service = m.service AND p.instance = m.instance AND p.start_ns = m.start_ns
    WHERE m.cold_start OR a.start_ns IS NOT NULL
       OR (coalesce((m.trace_id, m.request_id) = p.ids, false)
           AND (SELECT count(*) FROM first_ns) >= ?)
),
cold_side AS (
    SELECT count(*) AS n, median(wait) AS wait_p50, count(DISTINCT (service, instance)) AS instances,
           count(wait) AS waits
    FROM cold
),
bar AS (
    SELECT least(wait_p50 / ?, wait_p50 - ?) AS bar FROM cold_side
),
every_side AS (
    SELECT count(*) AS n, count(wait) AS waits,
           count_if(wait > bar AND wait <= 'inf'::DOUBLE) AS above
    FROM (SELECT coalesce(ttft_ms, ttft_client_ms, e2e_ms) AS wait FROM req), bar
),
cold_above AS (
    SELECT count_if(wait > bar AND wait <= 'inf'::DOUBLE) AS above FROM cold, bar
)
SELECT c.n AS cold_n, c.wait_p50 AS cold_wait_p50, c.instances AS cold_instances, b.bar,
       a.n - c.n AS warm_n, a.waits - c.waits AS warm_waits,
       a.above - ca.above AS warm_above
FROM cold_side c, bar b, every_side a, cold_above ca
