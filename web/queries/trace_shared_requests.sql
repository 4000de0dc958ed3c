-- Requests that shared engine steps with request $1 inside [$2, $3], most shared
-- steps first, with their trace ids for links.
WITH shared AS (
    SELECT request_id, count(*) AS steps
    FROM (
        SELECT unnest(request_ids) AS request_id
        FROM engine_steps
        WHERE start_ns BETWEEN $2 AND $3 AND list_contains(request_ids, $1)
    )
    GROUP BY request_id
)
SELECT s.request_id, s.steps, r.trace_id, r.e2e_ms, r.model, r.tenant, r.traffic_class
FROM shared s
LEFT JOIN (
    SELECT request_id, trace_id, e2e_ms, model, tenant, traffic_class
    FROM requests
    WHERE start_ns BETWEEN $2 - 600000000000 AND $3
) r USING (request_id)
WHERE s.request_id <> $1
ORDER BY s.steps DESC, s.request_id
