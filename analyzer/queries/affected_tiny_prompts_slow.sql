-- Small prompts (<= ? tokens) whose time went mostly to network + queue; worst first.
SELECT trace_id, kept FROM req
WHERE prompt_tokens <= ? AND e2e_ms > 0 AND (coalesce(network_ms, 0) + queue_ms) >= 0.5 * e2e_ms
ORDER BY coalesce(network_ms, 0) + queue_ms DESC LIMIT 5000
