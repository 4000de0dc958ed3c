-- Streams that decoded at least ? ms a token (stretched past the unloaded step), slowest first.
SELECT trace_id, kept FROM req
WHERE tpot_ms >= ? AND output_tokens >= 3
ORDER BY tpot_ms DESC LIMIT 5000
