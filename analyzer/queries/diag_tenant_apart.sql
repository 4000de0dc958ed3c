-- big_tenants_slower's first check on the lighter tenants' contrast (diag_tenant_beside): the
-- light requests (class ? or all) that arrived with none of the heavy tenants' (list ?)
-- requests in flight on their instance (`alone`, in_flight_gaps: no sweep of every light
-- request) and their median wait, and, of the light requests beside heavy ones (every other),
-- how many and how many wait less than a bar: the greater of the median apart times ? and the
-- median apart plus ? ms (less a hair, ? ms again, so that a wait below it stays below in the
-- reader's float arithmetic).  The reader rules the contrast out where more than half of those
-- beside are below it (_base.median_surely_below), and takes the sweep where it cannot.
WITH tenant_rows AS NOT MATERIALIZED (
    SELECT *, list_contains(?, tenant) AS heavy
    FROM req WHERE tenant <> '' AND (? IS NULL OR traffic_class = ?)
),
heavy AS MATERIALIZED (
    SELECT service, instance, start_ns AS s, start_ns + CAST(e2e_ms * 1e6 AS BIGINT) AS e
    FROM tenant_rows WHERE heavy
),
light AS NOT MATERIALIZED (
    SELECT service, instance, start_ns AS t, coalesce(ttft_client_ms, ttft_ms, e2e_ms) AS wait
    FROM tenant_rows WHERE NOT heavy
),
{in_flight_gaps},
apart AS (
    SELECT count(*) AS n, median(wait) AS wait_p50 FROM alone
),
bars AS (
    SELECT greatest(? * greatest(wait_p50, 1e-9), wait_p50 + ? - 1e-9 * (abs(wait_p50) + ?) - 1e-9) AS wait_bar
    FROM apart
),
light_counts AS (
    SELECT count(*) AS n, count(wait) AS wait_n, count_if(wait < wait_bar) AS wait_below
    FROM light, bars
),
alone_counts AS (
    SELECT count(wait) AS wait_n, count_if(wait < wait_bar) AS wait_below FROM alone, bars
)
SELECT
    (SELECT n FROM heavy_reversed)                               AS reversed,
    apart.n                                                     AS apart_n,
    apart.wait_p50                                              AS apart_wait_p50,
    lc.n - apart.n                                              AS beside_n,
    lc.wait_n - ac.wait_n                                       AS beside_wait_n,
    lc.wait_below - ac.wait_below                               AS beside_wait_below
FROM apart, light_counts lc, alone_counts ac
