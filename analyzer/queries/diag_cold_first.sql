-- cold_start's first check, before diag_cold_start (which takes the median wait of every warm
-- request: 0.58 CPU-s at 10 M requests in a file, 0.82 over a lake; 0.72 and 2.27 where it
-- flagged every request cold or warm).  This one: 0.22 and 0.39.  The cold side is `cold_set`'s (as `cold_requests` finds it, from the few requests
-- that can be cold).  Of the warm side it gives counts only: how many, how many waits, and
-- how many of those are above a bar drawn from the cold median (its p50 over ?, and less
-- ? ms): the reader rules the finding out where more than half of the warm waits are above
-- the bar (the warm median is then too), and it runs diag_cold_start where it cannot.  A NaN
-- wait is not counted above (DuckDB sorts it last: a NaN median would read as a finding): it
-- is the one value above infinity (`NOT isnan(wait)` cost 0.02 CPU-s more at 10 M requests).
WITH {cold_set},
cold_side AS (
    SELECT count(*) AS n, median(wait) AS wait_p50,
           count(DISTINCT (service, instance)) AS instances, count(wait) AS waits
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
