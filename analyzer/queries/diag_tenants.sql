-- Per tenant: volume (tokens, else requests), to split the heaviest tenants from the rest.
-- Class ? or all.  Only the volume: the tenants are compared pooled (diag_tenant_groups);
-- per-tenant tail latency and queue were computed here unread (three quantiles: most of this
-- query's 1.3 CPU-s at 10 M requests).
-- Read where diag_slice_mix has too many rows (slice_mix.tenant_volumes adds it up from
-- that pass otherwise, held to this query by tests/analyzer/test_slice_mix.py).
SELECT
    tenant,
    count(*)                                                    AS n,
    coalesce(sum(coalesce(prompt_tokens, 0) + coalesce(output_tokens, 0)), 0) AS tokens
FROM req
WHERE tenant <> '' AND (? IS NULL OR traffic_class = ?)
GROUP BY tenant
ORDER BY tokens DESC, n DESC, tenant
