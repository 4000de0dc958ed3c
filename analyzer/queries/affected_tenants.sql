-- Requests of the suffering tenants (list ?), most queued first.
WITH affected AS (
    SELECT * FROM req
    WHERE list_contains(?, tenant)
)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY queue_ms DESC, trace_id LIMIT 5000
