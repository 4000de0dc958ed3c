-- Interactive requests in slices (? ns) where batch traffic was running, against slices
-- where it was not.
WITH b AS (
    SELECT DISTINCT start_ns // ? AS slice FROM req WHERE traffic_class = 'batch'
)
SELECT
    (b.slice IS NOT NULL)                                       AS with_batch,
    count(*)                                                    AS n,
    median(coalesce(ttft_ms, ttft_client_ms))                   AS ttft_p50,
    median(tpot_ms)                                             AS tpot_p50,
    median(queue_wait_ms)                                       AS queue_wait_p50,
    sum(e2e_ms)                                                 AS e2e_total
FROM req LEFT JOIN b ON req.start_ns // ? = b.slice
WHERE req.traffic_class <> 'batch'
GROUP BY with_batch
