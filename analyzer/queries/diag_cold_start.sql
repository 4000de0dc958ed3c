-- Cold requests against warm ones (`cold_requests` says which are cold).  The cold side is
-- `cold_set`'s, found from the few requests that can be cold.  The warm side is every other
-- request: the unmarked ones at no unmarked cold request's start instant (an anti join on one
-- number, where cold_requests' flags joined every request on its instance and start: 2.27 ->
-- 0.82 CPU-s at 10 M requests over a lake, 0.72 -> 0.61 in a file), and those at such an
-- instant that are not cold (few).
-- The instances are counted for the cold side only (the warm side's is 0).  The cold E2E
-- (the finding's impact) is summed in order: `cold`'s parts arrive in any order, and a sum
-- of floats in another order differs in its last digit (the finding with it).
WITH {cold_set},
cold_instants AS (
    SELECT DISTINCT start_ns FROM cold WHERE NOT cold_start
),
far AS (
    SELECT coalesce(r.ttft_ms, r.ttft_client_ms, r.e2e_ms) AS wait, r.e2e_ms
    FROM req r ANTI JOIN cold_instants c ON c.start_ns = r.start_ns
    WHERE NOT r.cold_start
),
-- an unmarked request is cold for its service, instance, start and ids alone (after_starts,
-- first_pick): one at a cold request's instant with all of these the same is cold too
near_warm AS (
    SELECT coalesce(r.ttft_ms, r.ttft_client_ms, r.e2e_ms) AS wait, r.e2e_ms
    FROM req r SEMI JOIN cold_instants c ON c.start_ns = r.start_ns
    ANTI JOIN (SELECT * FROM cold WHERE NOT cold_start) k
      ON k.service = r.service AND k.instance = r.instance AND k.start_ns = r.start_ns
     AND k.trace_id = r.trace_id AND k.request_id = r.request_id
    WHERE NOT r.cold_start
),
warm AS (
    SELECT * FROM far UNION ALL SELECT * FROM near_warm
)
SELECT true AS cold, count(*) AS n, median(wait) AS wait_p50,
       count(DISTINCT (service, instance)) AS instances,
       count(*) FILTER (WHERE cold_start) AS marked,
       count(*) FILTER (WHERE after_start) AS after_start,
       sum(e2e_ms ORDER BY e2e_ms) AS e2e_total
FROM cold HAVING count(*) > 0
UNION ALL
SELECT false, count(*), median(wait), 0, 0, 0, sum(e2e_ms) FROM warm HAVING count(*) > 0
