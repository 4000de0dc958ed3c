-- Offered load per slice (? ns): compute work arriving (prefill + decode) / slice length,
-- i.e. how many requests the engine must hold at once.  It excludes queue time on
-- purpose: load measured through the queue would find queueing by construction.
-- Requests in the most loaded quarter of slices against the least loaded half.
WITH s AS (
    SELECT start_ns // ? AS slice, sum(prefill_ms + decode_ms) * 1e6 / ? AS in_flight, count(*) AS arrivals
    FROM req GROUP BY 1
),
ranked AS (SELECT *, ntile(4) OVER (ORDER BY in_flight, slice) AS q FROM s),
r AS (
    SELECT req.*, ranked.q, ranked.in_flight
    FROM req JOIN ranked ON req.start_ns // ? = ranked.slice
)
SELECT
    CASE WHEN q = 4 THEN 'high' WHEN q <= 2 THEN 'low' ELSE 'mid' END AS load,
    count(*)                                                    AS n,
    avg(in_flight)                                              AS in_flight,
    sum(queue_ms) / nullif(sum(e2e_ms), 0)                      AS queue_share,
    median(e2e_ms)                                              AS e2e_p50,
    median(queue_ms)                                            AS queue_p50,
    sum(e2e_ms)                                                 AS e2e_total
FROM r
GROUP BY 1
