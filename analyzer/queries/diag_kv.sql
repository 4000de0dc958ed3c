-- Engine steps of the window: KV-cache usage and queue depth.
SELECT
    count(*) FILTER (WHERE kv_usage IS NOT NULL)                AS steps,
    count(*) FILTER (WHERE kv_usage >= ?)                       AS high,
    quantile_cont(kv_usage, 0.5)                                AS kv_p50,
    max(kv_usage)                                               AS kv_max,
    avg(queue_depth) FILTER (WHERE kv_usage >= ?)               AS depth_high,
    avg(queue_depth) FILTER (WHERE kv_usage < ?)                AS depth_low
FROM engine_steps
WHERE start_ns BETWEEN ? AND ? AND (? IS NULL OR service = ?)
