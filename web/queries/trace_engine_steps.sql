-- Engine steps of the request's engine that overlap [$2, $3], with whether each one served
-- request $1 (and then the ids it served, for the requests that shared it).  $4 is the
-- service, $5 the instance ('' = any); $6 the earliest start of a step that can still
-- overlap (web/_trace.py STEP_LOOKBACK_NS: a bound on start_ns alone lets the scan skip the
-- row groups and files before it).
--
-- The engine is chosen by `request_engines`' rule (analyzer/queries/request_engines.sql),
-- for this one request and from the same steps: its own instance if that one recorded steps
-- in [$2, $3], else those of its service whose steps there name the request, else its own.
-- `engine_steps` is read once (`around`), not once for each part of the rule: over a lake
-- every scan costs its catalog work (the files, their statistics, the inlined rows).
WITH around AS MATERIALIZED (
    SELECT service, instance, start_ns, duration_us, prefill_tokens, decode_seqs, batch_size,
           queue_depth, kv_usage, gpu_us, forward_host_us, request_ids
    FROM engine_steps
    WHERE start_ns BETWEEN $6 AND $3
      AND start_ns + duration_us * 1000 >= $2
      AND (service = $4 OR $4 = '')
),
in_lifetime AS (
    SELECT instance, list_contains(request_ids, $1) AS served
    FROM around
    WHERE service = $4 AND start_ns >= $2
),
engine AS (
    SELECT DISTINCT instance FROM in_lifetime
    WHERE served AND NOT EXISTS (SELECT 1 FROM in_lifetime WHERE instance = $5)
    UNION
    SELECT $5 WHERE EXISTS (SELECT 1 FROM in_lifetime WHERE instance = $5)
                 OR NOT EXISTS (SELECT 1 FROM in_lifetime WHERE served)
)
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
    list_contains(request_ids, $1)                                      AS served,
    len(request_ids)                                                    AS request_count,
    CASE WHEN list_contains(request_ids, $1) THEN request_ids END       AS served_with
FROM around
WHERE instance IN (SELECT instance FROM engine) OR $5 = ''
ORDER BY start_ns
