-- Engine steps of the request's engine that overlap [$2, $3], with whether each one
-- served request $1.  $4 is the service, $5 the instance ('' = any); $6 the earliest start
-- of a step that can still overlap (web/_trace.py STEP_LOOKBACK_NS: a bound on start_ns
-- alone lets the scan skip the row groups and files before it).  The engine is
-- `request_engine`'s (analyzer/queries/request_engines.sql): its own instance if that one
-- recorded steps in [$2, $3], else those whose steps name the request then, else its own.
WITH asked AS (
    SELECT '' AS trace_id, $1 AS request_id, $4 AS service, $5 AS instance,
           CAST($2 AS BIGINT) AS t0, CAST($3 AS BIGINT) AS t1
),
{request_engines}
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
WHERE start_ns BETWEEN $6 AND $3
  AND start_ns + duration_us * 1000 >= $2
  AND (service = $4 OR $4 = '')
  AND (instance IN (SELECT engine FROM request_engine) OR $5 = '')
ORDER BY start_ns
