-- Requests of the suffering tenants (list ?), most queued first.
SELECT trace_id, kept FROM req
WHERE list_contains(?, tenant)
ORDER BY queue_ms DESC LIMIT 5000
