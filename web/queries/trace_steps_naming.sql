-- How many engine steps that began in [$2, $3] name each request beside request $1, on any
-- engine: the shared requests of a request whose own engine's steps do not name it (its steps
-- recorded under another service: web/_trace.py `_shared_requests`).
SELECT request_id, count(*) AS steps
FROM (
    SELECT unnest(request_ids) AS request_id
    FROM engine_steps
    WHERE start_ns BETWEEN $2 AND $3 AND list_contains(request_ids, $1)
)
GROUP BY request_id
