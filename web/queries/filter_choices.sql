-- The models, tenants and services seen, for the filter drop-downs (most requests first, then by
-- name: one order every time).
SELECT 'model' AS field, model AS value, count(*) AS n FROM requests GROUP BY model
UNION ALL
SELECT 'tenant', tenant, count(*) FROM requests GROUP BY tenant
UNION ALL
SELECT 'service', service, count(*) FROM requests GROUP BY service
ORDER BY field, n DESC, value
