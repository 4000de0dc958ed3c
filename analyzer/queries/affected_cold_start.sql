-- Cold requests (as in diag_cold_start: ? ns after a start-up, at least ? instances),
-- slowest first.
WITH firsts AS (
    SELECT *, instance <> '' AND row_number() OVER (PARTITION BY service, instance ORDER BY start_ns) = 1 AS first_seen,
           EXISTS (
               SELECT 1 FROM engine_starts e
               WHERE e.service = req.service AND e.instance = req.instance
                 AND req.start_ns BETWEEN e.start_ns AND e.end_ns + ?
           ) AS after_start
    FROM req
),
affected AS (
    SELECT * FROM firsts
    WHERE cold_start OR after_start OR (first_seen AND (SELECT count(*) FROM firsts WHERE first_seen) >= ?)
)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY coalesce(ttft_ms, ttft_client_ms, e2e_ms) DESC, trace_id LIMIT 5000
