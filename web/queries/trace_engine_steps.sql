-- Engine steps of the request's service that overlap [$2, $3], with whether
-- each one served request $1.  $4 is the service, $5 the instance ('' = any).
SELECT
    start_ns,
    duration_us,
    prefill_tokens,
    decode_seqs,
    batch_size,
    queue_depth,
    kv_usage,
    gpu_us,
    forward_host_us,
    list_contains(request_ids, $1) AS served,
    len(request_ids)               AS request_count
FROM engine_steps
WHERE start_ns <= $3
  AND start_ns + duration_us * 1000 >= $2
  AND (service = $4 OR $4 = '')
  AND (instance = $5 OR $5 = '')
ORDER BY start_ns
