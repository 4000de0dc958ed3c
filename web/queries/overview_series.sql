-- Per time bin of the filtered requests (CTE `req`): count, latency percentiles,
-- the four buckets' total time and how many requests have a user's TTFT (a client
-- span measured it: the TTFT (user) card says what part of the window it is over).
-- Parameters: origin_ns, bin_ns.
-- ITL over time is the spread of each request's median gap: per-gap percentiles
-- need the histograms, which cost too much per bin on millions of requests.
SELECT
    ((start_ns - ?) // ?)::BIGINT                       AS bin,
    count(*)                                            AS requests,
    quantile_cont(e2e_ms, [0.5, 0.9, 0.95, 0.99])       AS e2e,
    quantile_cont(ttft_ms, [0.5, 0.9, 0.95, 0.99])      AS ttft,
    quantile_cont(tpot_ms, [0.5, 0.9, 0.95, 0.99])      AS tpot,
    quantile_cont(itl_p50_ms, [0.5, 0.9, 0.95, 0.99])   AS itl,
    sum(network_ms)                                     AS network_total,  -- NULL: not measured in the bin
    sum(queue_ms)                                       AS queue_total,
    sum(prefill_ms)                                     AS prefill_total,
    sum(decode_ms)                                      AS decode_total,
    count(ttft_client_ms)                               AS ttft_client_requests
FROM req
GROUP BY ALL
ORDER BY bin
