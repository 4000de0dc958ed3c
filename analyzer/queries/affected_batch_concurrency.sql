-- Live requests that arrived while batch requests were in flight on their instance,
-- slowest first.
WITH {batch_in_flight},
affected AS (SELECT * FROM live_beside WHERE in_flight > 0)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY coalesce(ttft_ms, ttft_client_ms, e2e_ms) DESC, trace_id LIMIT 5000
