-- GPU samples of the request's service inside [$1, $2]; $3 is the service ('' = any).
SELECT gpu_index, ts_ns, utilization_pct, memory_used_bytes, memory_total_bytes, sm_clock_mhz, power_w
FROM gpu_samples
WHERE ts_ns BETWEEN $1 AND $2 AND (service = $3 OR $3 = '')
ORDER BY ts_ns
