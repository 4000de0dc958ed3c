-- The requests that shared engine steps with request $1 (web/_trace.py counts them from the
-- request's steps: $2 their ids, $3 how many steps each shared), most shared steps first,
-- with their trace ids for links: each looked up among the requests that started in
-- [$4 - 10 min, $5] (the request's lifetime is [$4, $5]).
WITH shared AS (
    SELECT unnest($2::VARCHAR[]) AS request_id, unnest($3::BIGINT[]) AS steps
)
SELECT s.request_id, s.steps, r.trace_id, r.e2e_ms, r.model, r.tenant, r.traffic_class
FROM shared s
LEFT JOIN (
    SELECT request_id, trace_id, e2e_ms, model, tenant, traffic_class
    FROM requests
    WHERE start_ns BETWEEN $4 - 600000000000 AND $5
      AND request_id IN (SELECT request_id FROM shared)
) r USING (request_id)
WHERE s.request_id <> $1
ORDER BY s.steps DESC, s.request_id
