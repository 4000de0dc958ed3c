-- How many streams the window has and how many froze (stall_count > 0): stutter's first
-- check.  Counts only: the medians diag_stutter adds read every stream's gaps (about 1 CPU-s
-- at 10 M requests, these counts 0.03), and most windows stop here.
SELECT
    count(*)                                                    AS n,
    count(*) FILTER (WHERE stall_count > 0)                     AS stalled
FROM req
WHERE itl_p50_ms IS NOT NULL AND output_tokens >= 3
