-- Requests of the suffering tenants (list ?), most queued first.
SELECT trace_id, kept, count(*) OVER () AS matched FROM req
WHERE list_contains(?, tenant)
ORDER BY queue_ms DESC, trace_id LIMIT 5000
