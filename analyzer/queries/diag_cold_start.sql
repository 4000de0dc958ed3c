-- Cold requests against warm ones (`cold_requests` says which are cold).  The instances are
-- counted for the cold side only (the warm side's is 0): the warm count was unread and hashed
-- every request's service and instance.
WITH {cold_requests},
r AS (
    SELECT *, coalesce(ttft_ms, ttft_client_ms, e2e_ms) AS wait FROM cold_req
)
SELECT cold, count(*) AS n, median(wait) AS wait_p50, count(DISTINCT (service, instance)) FILTER (WHERE cold) AS instances,
       count(*) FILTER (WHERE cold_start) AS marked, count(*) FILTER (WHERE after_start) AS after_start,
       sum(e2e_ms) AS e2e_total
FROM r GROUP BY cold
