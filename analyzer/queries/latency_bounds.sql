-- The window's counts and bounds (report.py reads them with latency_percentiles.sql): how
-- many requests, with a client span, with inter-token gaps; the ITL figures' bounds
-- (report.py `GapFigures`: with one request its own are the window's); the first and last
-- start.  Apart from the sums because DuckDB answers these from a table's statistics where
-- the window is the whole table: together they cost 0.41 CPU-s at 10 M requests, apart
-- 0.17 (a window of part of the time range: 0.28 together, 0.32 apart).
-- report.py `window_bounds` adds to it each of `LATENCY_COLUMNS`' count and range, which its
-- percentiles' linear passes start from (analyzer/quantiles.py): from statistics too in a
-- file (0.003 CPU-s at 10 M requests with them, 0.001 without), one scan of a lake's Parquet,
-- not two, and none of a column whose range the lake's catalog gives.
SELECT
    count(*)                                            AS requests,
    count(network_ms)                                   AS with_network,
    count(itl_p50_ms)                                   AS itl_requests,
    min(itl_p50_ms)                                     AS itl_p50_min,
    min(itl_p95_ms)                                     AS itl_p95_min,
    min(itl_p99_ms)                                     AS itl_p99_min,
    max(itl_max_ms)                                     AS itl_gap_max,
    min(start_ns)                                       AS first_start_ns,
    max(start_ns)                                       AS last_start_ns
    -- here report.py `window_bounds` adds the latency columns' counts and ranges it needs
FROM req
