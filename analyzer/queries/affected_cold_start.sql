-- Cold requests, slowest first.
WITH r AS (
    SELECT *, cold_start OR (instance <> '' AND row_number() OVER (PARTITION BY service, instance ORDER BY start_ns) = 1) AS cold
    FROM req
)
SELECT trace_id, kept FROM r WHERE cold
ORDER BY coalesce(ttft_ms, ttft_client_ms, e2e_ms) DESC LIMIT 5000
