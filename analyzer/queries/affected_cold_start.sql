-- Cold requests (as in diag_cold_start: `cold_requests`), slowest first.
WITH {cold_requests},
affected AS (
    SELECT * FROM cold_req WHERE cold
)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY coalesce(ttft_ms, ttft_client_ms, e2e_ms) DESC, trace_id LIMIT 5000
