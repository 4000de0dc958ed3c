-- Streams that decoded at least ? ms a token (stretched past the unloaded step), slowest first.
WITH affected AS (
    SELECT * FROM req
    WHERE tpot_ms >= ? AND output_tokens >= 3
)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY tpot_ms DESC, trace_id LIMIT 5000
