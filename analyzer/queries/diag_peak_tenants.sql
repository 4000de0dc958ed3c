-- Tenant mix in the busiest slices (? ns, list ?) and elsewhere: each tenant's share
-- of the arrivals on each side.  Counted per slice first, then the slices looked up in the
-- list (0.44 -> ~0.27 CPU-s at 10 M requests: a look-up per request cost more than the count).
-- Read where diag_slice_mix has too many rows (slice_mix.tenant_shares adds it up from
-- that pass otherwise, held to this query by tests/analyzer/test_slice_mix.py).
WITH per_slice AS (
    SELECT start_ns // ? AS slice, tenant, count(*) AS n
    FROM req
    GROUP BY ALL
),
t AS (
    SELECT list_contains(?, slice) AS busy, tenant, sum(n) AS n
    FROM per_slice
    GROUP BY ALL
)
SELECT busy, tenant, n::DOUBLE / sum(n) OVER (PARTITION BY busy) AS share
FROM t
