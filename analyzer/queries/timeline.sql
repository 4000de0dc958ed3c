-- Per time slice (? ns) for charts: its requests, the queue's share of their E2E time, and
-- their E2E and TTFT values as lists, whose p50/p95(/p99) report.py takes in NumPy
-- (quantiles.array_quantiles, `quantile_cont` to the bit).  At 10 M requests (61 slices,
-- medians of 5 runs) `quantile_cont` here cost 1.08 CPU-s; gathering the lists costs 0.57,
-- fetching them 0.03 and selecting in them 0.22.  The linear passes per slice
-- (quantiles.grouped_quantiles) cost 1.57: counting 61 x 4,096 slices of a range is a
-- larger hash table than one window's, and the third pass joins on slice and group.
SELECT
    start_ns // ? * ?                                           AS slice_start_ns,
    count(*)                                                    AS requests,
    list(e2e_ms)                                                AS e2e,
    list(coalesce(ttft_ms, ttft_client_ms))                     AS ttft,
    sum(queue_ms) / nullif(sum(e2e_ms), 0)                      AS queue_share
FROM req
GROUP BY 1
ORDER BY 1
