-- What counts as a large prefill step in this window: p90 of non-zero prefill sizes
-- (of the report's service, when it has one).
SELECT count(*) AS steps, quantile_disc(prefill_tokens, 0.9) AS p90, max(prefill_tokens) AS max
FROM engine_steps
WHERE prefill_tokens > 0 AND start_ns BETWEEN ? AND ? AND (? IS NULL OR service = ?)
