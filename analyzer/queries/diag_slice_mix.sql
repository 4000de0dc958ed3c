-- The window's requests counted once per time slice (? ns), tenant and traffic class: what
-- the per-slice signals add up (diagnosis/slice_mix.py): peak_hours' arrivals per slice
-- (as diag_slices), their queue and E2E sums and E2E ranges (diag_peak), the tenant mix of
-- the busy slices (diag_peak_tenants), batch_mode's sides (diag_batch_mode_sides) and
-- big_tenants' volumes (diag_tenants).  Those five read every request apart: 0.79 CPU-s at
-- 10 M requests, this one pass 0.33 (and over a lake one statement and one scan, not five).
-- Run only where its rows are surely few (`Context.slice_mix`: slices × tenants × classes);
-- where tenants are many (one per end user) the signals run the five queries instead.
SELECT
    start_ns // ?                                               AS slice,
    tenant,
    traffic_class,
    count(*)                                                    AS n,
    sum(queue_ms)                                               AS queue_total,
    sum(e2e_ms)                                                 AS e2e_total,
    count(e2e_ms)                                               AS e2e_n,
    min(e2e_ms)                                                 AS e2e_min,
    max(e2e_ms)                                                 AS e2e_max,
    coalesce(sum(coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0)), 0) AS tokens
FROM req
GROUP BY ALL
