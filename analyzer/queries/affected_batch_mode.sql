-- Interactive requests that arrived while batch traffic ran (slice length ?), slowest first.
WITH b AS (SELECT DISTINCT start_ns // ? AS slice FROM req WHERE traffic_class = 'batch'),
affected AS (
    SELECT * FROM req SEMI JOIN b ON req.start_ns // ? = b.slice
    WHERE traffic_class <> 'batch'
)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY coalesce(ttft_ms, ttft_client_ms, e2e_ms) DESC, trace_id LIMIT 5000
