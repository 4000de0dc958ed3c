-- What the engines sent beside the requests, each from ? to ? and of the report's service
-- where it has one (? twice): engine steps and which of their measures are known (NULL:
-- the engine does not give it), GPU samples, engine start-ups (from a little before the
-- window: its first requests are theirs).
WITH st AS (
    SELECT count(*) AS engine_steps, count(batch_size) AS step_batch_sizes,
           count(decode_seqs) AS step_decodes, count(kv_usage) AS step_kv
    FROM engine_steps WHERE start_ns BETWEEN ? AND ? AND (? IS NULL OR service = ?)
),
gs AS (
    SELECT count(*) AS gpu_samples, count(memory_used_bytes) AS gpu_memory
    FROM gpu_samples WHERE ts_ns BETWEEN ? AND ? AND (? IS NULL OR service = ?)
),
es AS (
    SELECT count(*) AS engine_starts
    FROM engine_starts WHERE end_ns BETWEEN ? AND ? AND (? IS NULL OR service = ?)
)
SELECT * FROM st, gs, es
