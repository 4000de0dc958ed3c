-- Cold requests (the SDK's mark, or the first request seen from an instance) against warm ones.
WITH r AS (
    SELECT *, coalesce(ttft_ms, ttft_client_ms, e2e_ms) AS wait,
           cold_start OR (instance <> '' AND row_number() OVER (PARTITION BY service, instance ORDER BY start_ns) = 1) AS cold
    FROM req
)
SELECT cold, count(*) AS n, median(wait) AS wait_p50, count(DISTINCT instance) AS instances,
       sum(e2e_ms) AS e2e_total
FROM r GROUP BY cold
