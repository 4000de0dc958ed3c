-- Shared CTEs: the lighter tenants' requests with how many of the heavy tenants' (list ?)
-- requests were in flight on their instance (same service and instance) when they arrived;
-- class ? or all.  A query includes them as `{heavy_in_flight}` in its WITH list;
-- `light_beside` is each light request with `in_flight`.  One sweep over the heavy
-- requests' starts and ends and the light ones' arrivals.
tenant_rows AS (
    SELECT *, list_contains(?, tenant) AS heavy
    FROM req WHERE tenant <> '' AND (? IS NULL OR traffic_class = ?)
),
heavy_events AS (
    SELECT service, instance, start_ns AS moment, 1 AS d, NULL AS trace_id, NULL AS request_id
    FROM tenant_rows WHERE heavy
    UNION ALL
    SELECT service, instance, start_ns + CAST(e2e_ms * 1e6 AS BIGINT), -1, NULL, NULL
    FROM tenant_rows WHERE heavy
    UNION ALL
    SELECT service, instance, start_ns, 0, trace_id, request_id FROM tenant_rows WHERE NOT heavy
),
heavy_running AS (
    SELECT trace_id, request_id, d,
           sum(d) OVER (PARTITION BY service, instance ORDER BY moment, d DESC ROWS UNBOUNDED PRECEDING) AS in_flight
    FROM heavy_events
),
light_beside AS (
    SELECT t.*, r.in_flight
    FROM tenant_rows t JOIN heavy_running r ON r.d = 0 AND r.trace_id = t.trace_id AND r.request_id = t.request_id
    WHERE NOT t.heavy
)
