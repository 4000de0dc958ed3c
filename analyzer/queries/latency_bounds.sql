-- The window's counts and bounds (report.py reads them with latency_percentiles.sql): how
-- many requests, with a client span, with inter-token gaps; the ITL figures' bounds
-- (report.py `GapFigures`: with one request its own are the window's); the first and last
-- start.  Apart from the sums because DuckDB answers these from a table's statistics where
-- the window is the whole table: together they cost 0.41 CPU-s at 10 M requests, apart
-- 0.17 (a window of part of the time range: 0.28 together, 0.32 apart).
-- With them each of report.py's `LATENCY_COLUMNS`' count and range, which its percentiles'
-- linear passes start from (analyzer/quantiles.py): from statistics too in a file (0.003
-- CPU-s at 10 M requests with them, 0.001 without), and one scan of a lake's Parquet, not two.
SELECT
    count(*)                                            AS requests,
    count(network_ms)                                   AS with_network,
    count(itl_p50_ms)                                   AS itl_requests,
    min(itl_p50_ms)                                     AS itl_p50_min,
    min(itl_p95_ms)                                     AS itl_p95_min,
    min(itl_p99_ms)                                     AS itl_p99_min,
    max(itl_max_ms)                                     AS itl_gap_max,
    min(start_ns)                                       AS first_start_ns,
    max(start_ns)                                       AS last_start_ns,
    count(e2e_ms)                                       AS e2e_count,
    min(e2e_ms)                                         AS e2e_min,
    max(e2e_ms)                                         AS e2e_max,
    count(ttft_ms)                                      AS ttft_count,
    min(ttft_ms)                                        AS ttft_min,
    max(ttft_ms)                                        AS ttft_max,
    count(ttft_client_ms)                               AS ttft_client_count,
    min(ttft_client_ms)                                 AS ttft_client_min,
    max(ttft_client_ms)                                 AS ttft_client_max,
    count(tpot_ms)                                      AS tpot_count,
    min(tpot_ms)                                        AS tpot_min,
    max(tpot_ms)                                        AS tpot_max,
    count(network_ms)                                   AS network_count,
    min(network_ms)                                     AS network_min,
    max(network_ms)                                     AS network_max,
    count(queue_ms)                                     AS queue_count,
    min(queue_ms)                                       AS queue_min,
    max(queue_ms)                                       AS queue_max,
    count(prefill_ms)                                   AS prefill_count,
    min(prefill_ms)                                     AS prefill_min,
    max(prefill_ms)                                     AS prefill_max,
    count(decode_ms)                                    AS decode_count,
    min(decode_ms)                                      AS decode_min,
    max(decode_ms)                                      AS decode_max
FROM req
