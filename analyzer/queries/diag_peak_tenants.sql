-- Tenant mix in the busiest slices (list ?) and elsewhere: each tenant's share
-- of the arrivals on each side.
WITH t AS (
    SELECT list_contains(?, start_ns // ?) AS busy, tenant, count(*) AS n
    FROM req
    GROUP BY ALL
)
SELECT busy, tenant, n::DOUBLE / sum(n) OVER (PARTITION BY busy) AS share
FROM t
