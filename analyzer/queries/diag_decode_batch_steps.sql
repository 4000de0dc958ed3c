-- Decode step time against the batch it decodes: engine steps that decode and prefill
-- nothing (a prefill in the step is stutter's stall signal; TGI's prefill steps decode no
-- sequence), between ? and ? ns, of the report's service when it has one.  The steps
-- that decode the fewest sequences (bottom quarter of batch sizes) against the most (top
-- quarter): medians, so a few slow steps (a GC pause, a preemption) move neither.
WITH d AS (
    SELECT decode_seqs AS batch, duration_us / 1000.0 AS step_ms
    FROM engine_steps
    WHERE prefill_tokens = 0 AND decode_seqs > 0
      AND start_ns BETWEEN ? AND ? AND (? IS NULL OR service = ?)
),
q AS (SELECT quantile_disc(batch, 0.25) AS lo, quantile_disc(batch, 0.75) AS hi FROM d)
SELECT
    count(*)                                                    AS steps,
    count(*) FILTER (WHERE batch <= q.lo)                       AS small_steps,
    min(batch) FILTER (WHERE batch <= q.lo)                     AS small_batch_min,
    max(batch) FILTER (WHERE batch <= q.lo)                     AS small_batch_max,
    median(step_ms) FILTER (WHERE batch <= q.lo)                AS small_step_p50,
    count(*) FILTER (WHERE batch >= q.hi)                       AS large_steps,
    min(batch) FILTER (WHERE batch >= q.hi)                     AS large_batch_min,
    max(batch) FILTER (WHERE batch >= q.hi)                     AS large_batch_max,
    median(step_ms) FILTER (WHERE batch >= q.hi)                AS large_step_p50,
    -- what one more sequence in the batch adds to a step (least squares over every step)
    regr_slope(step_ms, batch)                                  AS ms_per_sequence
FROM d, q
