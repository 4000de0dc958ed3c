-- NVML samples of the window: how often the GPU was saturated, and memory pressure.
SELECT
    count(*)                                                    AS samples,
    count(*) FILTER (WHERE utilization_pct >= ?)                AS saturated,
    avg(utilization_pct)                                        AS util_mean,
    count(*) FILTER (WHERE memory_used_bytes >= ? * memory_total_bytes) AS mem_high,
    count(*) FILTER (WHERE memory_total_bytes > 0)              AS mem_known,
    max(memory_used_bytes / nullif(memory_total_bytes, 0))      AS mem_max_frac
FROM gpu_samples
WHERE ts_ns BETWEEN ? AND ? AND (? IS NULL OR service = ?)
