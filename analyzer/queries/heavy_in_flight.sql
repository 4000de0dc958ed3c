-- Shared CTEs: the lighter tenants' requests with how many of the heavy tenants' (list ?)
-- requests were in flight on their instance (same service and instance) when they arrived;
-- class ? or all.  A query includes them as `{heavy_in_flight}` in its WITH list;
-- `light_beside` is each light request with `in_flight` and `wait`.  One sweep over the heavy
-- requests' starts and ends and the light ones' arrivals.
-- NOT MATERIALIZED: read three times below, DuckDB would otherwise copy every column of every
-- request once; inlined, each branch reads only what the query uses (half the CPU at 10 M).
tenant_rows AS NOT MATERIALIZED (
    SELECT *, list_contains(?, tenant) AS heavy
    FROM req WHERE tenant <> '' AND (? IS NULL OR traffic_class = ?)
),
-- The light requests ride through the sweep whole (UNION ALL BY NAME pads the heavy events'
-- other columns with NULL), not joined back to `tenant_rows` on their ids after it.
-- `d` is a TINYINT (see batch_in_flight): its running sum is several times cheaper.  `wait`
-- (the first token as the client saw it, else the server's, else the whole request) is one
-- column through the window, not three, and `in_flight` an INTEGER (see batch_in_flight).
heavy_events AS (
    SELECT service, instance, start_ns AS moment, CAST(1 AS TINYINT) AS d FROM tenant_rows WHERE heavy
    UNION ALL BY NAME
    SELECT service, instance, start_ns + CAST(e2e_ms * 1e6 AS BIGINT) AS moment, CAST(-1 AS TINYINT) AS d
    FROM tenant_rows WHERE heavy
    UNION ALL BY NAME
    SELECT *, coalesce(ttft_client_ms, ttft_ms, e2e_ms) AS wait, start_ns AS moment, CAST(0 AS TINYINT) AS d
    FROM tenant_rows WHERE NOT heavy
),
heavy_running AS (
    SELECT *,
           CAST(sum(d) OVER (PARTITION BY service, instance ORDER BY moment, d DESC ROWS UNBOUNDED PRECEDING)
                AS INTEGER) AS in_flight
    FROM heavy_events
),
light_beside AS (
    SELECT * EXCLUDE (moment, d) FROM heavy_running WHERE d = 0
)
