-- Requests whose first token took >= ? ms, mostly pre-fill (measured: server seen); longest wait first.
WITH affected AS (
    SELECT * FROM req
    WHERE coalesce(ttft_ms, ttft_client_ms) >= ? AND prefill_ms >= 0.5 * coalesce(ttft_ms, ttft_client_ms)
        AND NOT list_contains(flags, 'server_unseen')
)
SELECT trace_id, kept, (SELECT count(*) FROM affected) AS matched FROM affected
ORDER BY coalesce(ttft_ms, ttft_client_ms) DESC, trace_id LIMIT 5000
