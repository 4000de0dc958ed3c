-- batch_mode_breaks_live's first check on its request-level contrast (diag_batch_concurrency):
-- the live requests that arrived with no batch request in flight on their instance (`alone`,
-- in_flight_gaps: no sweep of every live request) and their TTFT and TPOT medians, and, of the
-- live requests beside batch requests (every other live request), how many and how many of
-- them are below a bar: the median apart times ? (TTFT) and ? (TPOT).  The reader rules the
-- contrast out where more than half of those beside are below both bars (_base.
-- median_surely_below), and takes the sweep where it cannot.  `reversed`: see in_flight_gaps.
WITH heavy AS MATERIALIZED (
    SELECT service, instance, start_ns AS s, start_ns + CAST(e2e_ms * 1e6 AS BIGINT) AS e
    FROM req WHERE traffic_class = 'batch'
),
light AS NOT MATERIALIZED (
    SELECT service, instance, start_ns AS t, coalesce(ttft_ms, ttft_client_ms) AS ttft, tpot_ms
    FROM req WHERE traffic_class <> 'batch'
),
{in_flight_gaps},
apart AS (
    SELECT count(*) AS n, median(ttft) AS ttft_p50, median(tpot_ms) AS tpot_p50 FROM alone
),
bars AS (
    SELECT ? * ttft_p50 AS ttft_bar, ? * tpot_p50 AS tpot_bar FROM apart
),
light_counts AS (
    SELECT count(*) AS n, count(ttft) AS ttft_n, count_if(ttft < ttft_bar) AS ttft_below,
           count(tpot_ms) AS tpot_n, count_if(tpot_ms < tpot_bar) AS tpot_below
    FROM light, bars
),
alone_counts AS (
    SELECT count(ttft) AS ttft_n, count_if(ttft < ttft_bar) AS ttft_below,
           count(tpot_ms) AS tpot_n, count_if(tpot_ms < tpot_bar) AS tpot_below
    FROM alone, bars
)
SELECT
    (SELECT n FROM heavy_reversed)                               AS reversed,
    apart.n                                                     AS apart_n,
    apart.ttft_p50                                              AS apart_ttft_p50,
    apart.tpot_p50                                              AS apart_tpot_p50,
    lc.n - apart.n                                              AS beside_n,
    lc.ttft_n - ac.ttft_n                                       AS beside_ttft_n,
    lc.ttft_below - ac.ttft_below                               AS beside_ttft_below,
    lc.tpot_n - ac.tpot_n                                       AS beside_tpot_n,
    lc.tpot_below - ac.tpot_below                               AS beside_tpot_below
FROM apart, light_counts lc, alone_counts ac
