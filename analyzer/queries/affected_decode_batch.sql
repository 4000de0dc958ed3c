-- Streams that decoded at least ? ms a token (stretched past the unloaded step), slowest first.
SELECT trace_id, kept, count(*) OVER () AS matched FROM req
WHERE tpot_ms >= ? AND output_tokens >= 3
ORDER BY tpot_ms DESC, trace_id LIMIT 5000
