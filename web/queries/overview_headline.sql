-- The overview's headline while the full report is still being computed:
-- counts, E2E/TTFT (server and user)/TPOT percentiles and the buckets' total time of `req`.
SELECT
    count(*)                                            AS requests,
    count(*) FILTER (WHERE kept)                        AS kept,
    count(*) FILTER (WHERE error)                       AS errors,
    count(*) FILTER (WHERE network_ms IS NOT NULL)      AS with_network,
    quantile_cont(e2e_ms, [0.5, 0.9, 0.95, 0.99])       AS e2e,
    quantile_cont(ttft_ms, [0.5, 0.9, 0.95, 0.99])      AS ttft,
    quantile_cont(ttft_client_ms, [0.5, 0.9, 0.95, 0.99]) AS ttft_client,
    quantile_cont(tpot_ms, [0.5, 0.9, 0.95, 0.99])      AS tpot,
    sum(coalesce(network_ms, 0))                        AS network_total,
    sum(queue_ms)                                       AS queue_total,
    sum(prefill_ms)                                     AS prefill_total,
    sum(decode_ms)                                      AS decode_total,
    min(start_ns)                                       AS first_start_ns,
    max(start_ns)                                       AS last_start_ns
FROM req
